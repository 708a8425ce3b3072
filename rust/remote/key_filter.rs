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
//! over it. A server that answers page after page with no key but a fresh
//! continuation token would keep a listing going until its time limit: the
//! filter stops it after [`DEFAULT_MAX_EMPTY_PAGES`] such pages in a row
//! (`ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES`). The same count runs on Azure's
//! list pages (`comp=list`), which hold no S3 keys to take out.

use std::sync::atomic::{AtomicU64, Ordering};
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

/// Pages in a row that list no key yet promise more before a listing is
/// stopped. S3 may answer a short page now and then (keys deleted while it
/// lists, delete markers of a versioned bucket), but not a hundred empty
/// ones in a row; a server that does is looping.
pub const DEFAULT_MAX_EMPTY_PAGES: u64 = 100;

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
    /// Empty pages in a row that stop a listing (see the module doc).
    pub max_empty_pages: u64,
}

impl HttpConnector for FilteringConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(KeyFilter {
            inner,
            refused: Arc::clone(&self.refused),
            max_empty_pages: self.max_empty_pages,
            empty_in_a_row: AtomicU64::new(0),
        }))
    }
}

#[derive(Debug)]
struct KeyFilter {
    inner: HttpClient,
    refused: Arc<Refused>,
    max_empty_pages: u64,
    empty_in_a_row: AtomicU64,
}

#[derive(Debug)]
struct EmptyPages(u64);

impl std::fmt::Display for EmptyPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server answered {} list pages in a row with no key and a continuation token \
             for more; stopped (ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES sets the limit)",
            self.0
        )
    }
}

impl std::error::Error for EmptyPages {}

#[derive(Debug)]
struct PageTooLarge;

impl std::fmt::Display for PageTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a list response larger than {MAX_PAGE_BYTES} bytes")
    }
}

impl std::error::Error for PageTooLarge {}

/// A list request: S3's and GCS's XML `list-type=2`, or Azure's `comp=list`.
fn is_listing(req: &HttpRequest) -> bool {
    req.method() == http::Method::GET
        && req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "list-type=2" || p == "comp=list"))
}

/// Whether a list page names no object and no common prefix, yet says
/// there is more: S3's `<IsTruncated>true`, or a non-empty continuation
/// token or Azure `<NextMarker>`. Pages that do not read as text are not
/// empty (the client judges them).
pub fn is_empty_page_with_more(page: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(page) else {
        return false;
    };
    let lists_something = ["<Contents>", "<CommonPrefixes>", "<Blob>", "<BlobPrefix>"]
        .iter()
        .any(|tag| text.contains(tag));
    if lists_something {
        return false;
    }
    let token = |tag: &str| tag_text(text, tag).is_some_and(|t| !t.trim().is_empty());
    text.contains("<IsTruncated>true</IsTruncated>")
        || token("NextContinuationToken")
        || token("NextMarker")
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
        if is_empty_page_with_more(&page) {
            let run = self.empty_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
            if run >= self.max_empty_pages {
                // Not reset: a retry of this request fails the same way.
                return Err(HttpError::new(HttpErrorKind::Decode, EmptyPages(run)));
            }
        } else {
            self.empty_in_a_row.store(0, Ordering::Relaxed);
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
    fn a_page_is_empty_with_more_only_when_it_lists_nothing_and_promises_more() {
        let s3 = |body: &str, truncated: bool| {
            format!(
                "<ListBucketResult><KeyCount>0</KeyCount><IsTruncated>{truncated}</IsTruncated>\
                 <NextContinuationToken>t1</NextContinuationToken>{body}</ListBucketResult>"
            )
        };
        assert!(is_empty_page_with_more(s3("", true).as_bytes()));
        assert!(!is_empty_page_with_more(page(&["a"]).as_bytes()));
        assert!(!is_empty_page_with_more(
            s3("<CommonPrefixes><Prefix>a/</Prefix></CommonPrefixes>", true).as_bytes()
        ));
        // The last page of a listing: no key and no more.
        assert!(!is_empty_page_with_more(
            b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"
        ));
        let azure = |marker: &str| {
            format!("<EnumerationResults><Blobs></Blobs><NextMarker>{marker}</NextMarker></EnumerationResults>")
        };
        assert!(is_empty_page_with_more(azure("m2").as_bytes()));
        assert!(!is_empty_page_with_more(azure("").as_bytes()));
        assert!(!is_empty_page_with_more(&[0xff, 0xfe]));
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
