//! Listing pages with keys the client cannot hold.
//!
//! Why: S3 (and GCS's XML API) allow any UTF-8 key, including `a/../b`,
//! `a//b` and control characters, but `object_store` turns a listing page
//! into paths all or nothing: one such key fails the page, and with it the
//! whole listing. So the HTTP client of an S3 or GCS store passes through
//! [`KeyFilter`], which takes every `<Contents>` entry whose key is no
//! valid object path out of a list response before the client parses it,
//! and keeps the key; the scan reports each as a problem and goes on with
//! the others.
//!
//! Bounds: a page is read into memory only up to [`MAX_PAGE_BYTES`] (a
//! real page of 1,000 keys is about 300 KB), and the rewrite is one pass
//! over it.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use http_body_util::BodyExt;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpService, ReqwestConnector,
};
use object_store::path::Path as ObjectPath;

/// Largest list response read (a page of 1,000 keys is about 300 KB).
pub const MAX_PAGE_BYTES: usize = 64 << 20;

/// Most refused keys kept (the rest are counted).
const MAX_REFUSED_KEPT: usize = 10_000;

/// Keys taken out of list responses, shared by the connector and the scan.
#[derive(Debug, Default)]
pub struct Refused {
    inner: Mutex<(Vec<String>, u64)>,
}

impl Refused {
    fn add(&self, keys: Vec<String>) {
        if let Ok(mut g) = self.inner.lock() {
            g.1 += keys.len() as u64;
            let room = MAX_REFUSED_KEPT.saturating_sub(g.0.len());
            g.0.extend(keys.into_iter().take(room));
        }
    }

    /// The keys refused so far (at most 10,000) and how many there were.
    pub fn take(&self) -> (Vec<String>, u64) {
        self.inner
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default()
    }
}

/// An [`HttpConnector`] whose clients filter list responses (see the module
/// doc) and pass every other response through untouched.
#[derive(Debug, Clone)]
pub struct FilteringConnector {
    pub refused: Arc<Refused>,
}

impl HttpConnector for FilteringConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(KeyFilter {
            inner,
            refused: Arc::clone(&self.refused),
        }))
    }
}

#[derive(Debug)]
struct KeyFilter {
    inner: HttpClient,
    refused: Arc<Refused>,
}

#[derive(Debug)]
struct PageTooLarge;

impl std::fmt::Display for PageTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a list response larger than {MAX_PAGE_BYTES} bytes")
    }
}

impl std::error::Error for PageTooLarge {}

fn is_listing(req: &HttpRequest) -> bool {
    req.method() == http::Method::GET
        && req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "list-type=2"))
}

#[async_trait]
impl HttpService for KeyFilter {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let listing = is_listing(&req);
        let response = self.inner.execute(req).await?;
        if !listing || !response.status().is_success() {
            return Ok(response);
        }
        let (mut parts, mut body) = response.into_parts();
        let mut page: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                if page.len() + data.len() > MAX_PAGE_BYTES {
                    return Err(HttpError::new(HttpErrorKind::Decode, PageTooLarge));
                }
                page.extend_from_slice(&data);
            }
        }
        let (kept, refused) = without_invalid_keys(page);
        if !refused.is_empty() {
            self.refused.add(refused);
        }
        parts.headers.remove(http::header::CONTENT_LENGTH);
        Ok(HttpResponse::from_parts(parts, kept.into()))
    }
}

/// The page less each `<Contents>` entry whose `<Key>` is no valid object
/// path, and those keys. A page that is not UTF-8, or an entry whose key
/// cannot be decoded, is left as it is (the client then judges it).
pub fn without_invalid_keys(page: Vec<u8>) -> (Vec<u8>, Vec<String>) {
    let Ok(text) = std::str::from_utf8(&page) else {
        return (page, vec![]);
    };
    const OPEN: &str = "<Contents>";
    const CLOSE: &str = "</Contents>";
    let mut out = String::with_capacity(text.len());
    let mut refused = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let Some(len) = rest[start..].find(CLOSE) else {
            break;
        };
        let end = start + len + CLOSE.len();
        let entry = &rest[start..end];
        out.push_str(&rest[..start]);
        match tag_text(entry, "Key").and_then(unescape) {
            Some(key) if ObjectPath::parse(&key).is_err() => refused.push(key),
            _ => out.push_str(entry),
        }
        rest = &rest[end..];
    }
    if refused.is_empty() {
        return (page, refused);
    }
    out.push_str(rest);
    (out.into_bytes(), refused)
}

fn tag_text<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = text.find(&open)? + open.len();
    let len = text[start..].find(&format!("</{tag}>"))?;
    Some(&text[start..start + len])
}

/// XML character data with its five named entities and numeric references
/// decoded; None for anything else (an unknown entity, a bad reference).
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let semi = rest[amp..].find(';')? + amp;
        let name = &rest[amp + 1..semi];
        let c = match name {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = match name.strip_prefix("#x").or_else(|| name.strip_prefix("#X")) {
                    Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                    None => name.strip_prefix('#')?.parse().ok()?,
                };
                char::from_u32(code)?
            }
        };
        out.push(c);
        rest = &rest[semi + 1..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(keys: &[&str]) -> String {
        let entries: String = keys
            .iter()
            .map(|k| format!("<Contents><Key>{k}</Key><Size>3</Size></Contents>"))
            .collect();
        format!("<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name>{entries}<IsTruncated>false</IsTruncated></ListBucketResult>")
    }

    #[test]
    fn invalid_keys_are_taken_out_and_the_others_kept_in_order() {
        let (kept, refused) = without_invalid_keys(
            page(&[
                "a/x",
                "a/../b",
                "c//d",
                "./e",
                "ok/f&amp;g",
                "bad&#x1;key",
                "z",
            ])
            .into(),
        );
        let kept = String::from_utf8(kept).unwrap();
        assert_eq!(refused, ["a/../b", "c//d", "./e", "bad\u{1}key"]);
        assert_eq!(kept, page(&["a/x", "ok/f&amp;g", "z"]));
    }

    #[test]
    fn a_page_of_valid_keys_is_returned_as_it_came() {
        let p = page(&["a", "b/c", "d&lt;e"]);
        let (kept, refused) = without_invalid_keys(p.clone().into());
        assert!(refused.is_empty());
        assert_eq!(kept, p.into_bytes());
    }

    #[test]
    fn what_cannot_be_decoded_is_left_for_the_client() {
        for odd in ["a&bogus;b", "a&#xZZ;", "no-semicolon&amp"] {
            let p = page(&[odd]);
            let (kept, refused) = without_invalid_keys(p.clone().into());
            assert!(refused.is_empty(), "{odd}");
            assert_eq!(kept, p.into_bytes());
        }
        let (kept, refused) = without_invalid_keys(vec![0xff, 0xfe]);
        assert!(refused.is_empty());
        assert_eq!(kept, vec![0xff, 0xfe]);
    }

    #[test]
    fn unescape_matches_the_named_and_numeric_entities() {
        assert_eq!(
            unescape("&lt;&gt;&amp;&quot;&apos;&#65;&#x42;").unwrap(),
            "<>&\"'AB"
        );
        assert_eq!(unescape("plain").unwrap(), "plain");
        assert!(unescape("&#xD800;").is_none());
    }
}
