//! From a root URL to an object store client, configured from the standard
//! environment, and the tokio runtime its requests run on.
//!
//! The runtime is made on the first remote root and never before: importing
//! the package or scanning local files starts no thread and opens no socket.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};

use super::key_filter::{FilteringConnector, Refused, DEFAULT_MAX_EMPTY_PAGES};
use crate::error::{Area, Error, Result};

/// URL schemes read through object stores (S3 and compatibles, GCS, Azure).
pub const SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "azure", "abfs", "abfss"];

/// Seconds one request may take, connection to last byte
/// (`ADAPTERPROBE_REMOTE_TIMEOUT` overrides).
pub const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Retries of a request that failed with a 5xx, a timeout or a dropped
/// connection, with exponential backoff (`ADAPTERPROBE_REMOTE_RETRIES`).
pub const DEFAULT_RETRIES: usize = 3;

/// A connected root: the store, the prefix under it, the URL as given
/// (without a trailing slash).
pub struct Remote {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: ObjectPath,
    pub url: String,
    /// Keys the listing filter took out of S3 and GCS list pages (see
    /// [`super::key_filter`]).
    pub refused: Arc<Refused>,
}

/// How requests are bounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub timeout: Duration,
    pub retries: usize,
    /// List pages in a row with no key that stop a listing.
    pub max_empty_pages: u64,
}

fn env_number(name: &str) -> Result<Option<f64>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(v) if (0.0..=86_400.0).contains(&v) => Ok(Some(v)),
            _ => Err(Error::new(
                Area::Usage,
                "",
                format!("{name} must be a number of seconds between 0 and 86400, got {text:?}"),
            )),
        },
    }
}

impl Limits {
    /// The limits from `ADAPTERPROBE_REMOTE_TIMEOUT` (seconds) and
    /// `ADAPTERPROBE_REMOTE_RETRIES`, else the defaults.
    pub fn from_env() -> Result<Limits> {
        let timeout = env_number("ADAPTERPROBE_REMOTE_TIMEOUT")?.unwrap_or(DEFAULT_TIMEOUT_S);
        let retries = env_number("ADAPTERPROBE_REMOTE_RETRIES")?
            .map_or(DEFAULT_RETRIES, |r| r.min(20.0) as usize);
        let max_empty_pages = match std::env::var("ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES") {
            Err(_) => DEFAULT_MAX_EMPTY_PAGES,
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(n) if (1..=1_000_000).contains(&n) => n,
                _ => {
                    return Err(Error::new(
                        Area::Usage,
                        "",
                        format!(
                            "ADAPTERPROBE_REMOTE_MAX_EMPTY_PAGES must be a whole number of pages \
                             between 1 and 1000000, got {text:?}"
                        ),
                    ))
                }
            },
        };
        Ok(Limits {
            timeout: Duration::from_secs_f64(timeout.max(0.1)),
            retries,
            max_empty_pages,
        })
    }

    fn retry(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: self.retries,
            // Every retry of one request together stays within this.
            retry_timeout: self.timeout * (self.retries as u32 + 1),
        }
    }

    fn timeout_text(&self) -> String {
        format!("{}ms", self.timeout.as_millis().max(1))
    }

    fn connect_timeout_text(&self) -> String {
        format!("{}ms", self.timeout.as_millis().clamp(1, 10_000))
    }
}

/// The scheme of `root` when it is a URL (`scheme://...`), lower-cased.
pub fn scheme_of(root: &str) -> Option<String> {
    let (scheme, _) = root.split_once("://")?;
    let ok = !scheme.is_empty()
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    ok.then(|| scheme.to_ascii_lowercase())
}

/// A usage error about `url`, named in the message (an error's path is a
/// file path, which would fold a URL's `//`).
pub fn usage(url: &str, message: impl AsRef<str>) -> Error {
    Error::new(Area::Usage, "", format!("{url}: {}", message.as_ref()))
}

/// S3 endpoints given as `http://` (a local MinIO, moto, Ceph) need plain
/// HTTP allowed; `https://` and AWS itself do not.
fn endpoint_is_http() -> bool {
    ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"].iter().any(|k| {
        std::env::var(k).is_ok_and(|v| v.trim().to_ascii_lowercase().starts_with("http://"))
    })
}

/// Connect to the store holding `url` (`s3://bucket/prefix`, `gs://...`,
/// `az://container/prefix`), credentials and endpoint from the environment.
pub fn connect(url: &str, limits: &Limits) -> Result<Remote> {
    let Some(scheme) = scheme_of(url) else {
        return Err(usage(url, "not a URL (expected scheme://bucket/prefix)"));
    };
    if !SCHEMES.contains(&scheme.as_str()) {
        return Err(usage(
            url,
            format!(
                "unsupported URL scheme {scheme}://: scan reads s3://, gs://, az:// (also \
                 s3a, azure, abfs, abfss) and file:// roots"
            ),
        ));
    }
    let parsed = url::Url::parse(url).map_err(|e| usage(url, format!("not a valid URL: {e}")))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(usage(url, "names no bucket or container"));
    }
    let prefix = ObjectPath::from_url_path(parsed.path())
        .map_err(|e| usage(url, format!("not a valid object path: {e}")))?;
    let (timeout, connect_timeout) = (limits.timeout_text(), limits.connect_timeout_text());
    let refused = Arc::new(Refused::default());
    let filtering = FilteringConnector {
        refused: Arc::clone(&refused),
        max_empty_pages: limits.max_empty_pages,
    };
    let built: object_store::Result<Arc<dyn ObjectStore>> = match scheme.as_str() {
        "s3" | "s3a" => AmazonS3Builder::from_env()
            .with_url(url)
            .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), timeout)
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                connect_timeout,
            )
            .with_allow_http(endpoint_is_http())
            .with_retry(limits.retry())
            .with_http_connector(filtering)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        "gs" => GoogleCloudStorageBuilder::from_env()
            .with_url(url)
            .with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), timeout)
            .with_config(
                GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout),
                connect_timeout,
            )
            .with_retry(limits.retry())
            .with_http_connector(filtering)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        _ => MicrosoftAzureBuilder::from_env()
            .with_url(url)
            .with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), timeout)
            .with_config(
                AzureConfigKey::Client(ClientConfigKey::ConnectTimeout),
                connect_timeout,
            )
            .with_retry(limits.retry())
            .with_http_connector(filtering)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
    };
    let store = built.map_err(|e| usage(url, format!("cannot connect: {}", one_line(&e))))?;
    Ok(Remote {
        store,
        prefix,
        url: url.trim_end_matches('/').to_string(),
        refused,
    })
}

/// The text between `<tag>` and `</tag>` in an error body.
fn xml_field<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let start = text.find(&format!("<{tag}>"))? + tag.len() + 2;
    let len = text[start..].find(&format!("</{tag}>"))?;
    Some(&text[start..start + len])
}

/// Most characters of a store's error kept in a message.
const MAX_ERROR_CHARS: usize = 400;

/// An object store error on one line and short: the HTTP status and the
/// service's code and message when the server sent them, a hint for
/// refused credentials.
pub fn one_line(e: &object_store::Error) -> String {
    let text = full_text(e);
    let status = text
        .split_once("status code: ")
        .map(|(_, rest)| rest.split(':').next().unwrap_or(rest).trim().to_string());
    let short = match (status, xml_field(&text, "Code")) {
        (Some(status), Some(code)) => {
            let message = xml_field(&text, "Message").unwrap_or("");
            format!("{status}: {code}: {message}")
        }
        (Some(status), None) => format!("{status}: {text}"),
        _ => text,
    };
    let mut short: String = short.chars().take(MAX_ERROR_CHARS).collect();
    if short.starts_with("401") || short.starts_with("403") {
        short.push_str(CREDENTIALS_HINT);
    }
    short
}

/// What a refused request adds. `object_store` reads credentials from the
/// environment (and instance metadata), not from AWS profiles or SSO logins
/// in `~/.aws/config`: the hint says how to export those.
const CREDENTIALS_HINT: &str = " (check the credentials in the environment: AWS_ACCESS_KEY_ID and \
     AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*; an AWS profile or \
     SSO login (AWS_PROFILE, ~/.aws/config) is not read: eval \"$(aws configure \
     export-credentials --format env)\" puts its credentials in the environment)";

fn full_text(e: &object_store::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();

/// Run `future` to completion on the shared runtime, made on first use.
/// Called from reader threads (never from inside the runtime).
pub fn block_on<F: Future>(future: F) -> Result<F::Output> {
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("adapterprobe-remote")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    match runtime {
        Ok(rt) => Ok(rt.block_on(future)),
        Err(e) => Err(Error::new(
            Area::Usage,
            "",
            format!("cannot start the network runtime: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_recognised_and_others_refused() {
        assert_eq!(scheme_of("s3://b/p").as_deref(), Some("s3"));
        assert_eq!(scheme_of("GS://b").as_deref(), Some("gs"));
        assert_eq!(scheme_of("/local/path"), None);
        assert_eq!(scheme_of("://x"), None);
        let limits = Limits {
            timeout: Duration::from_secs(1),
            retries: 0,
            max_empty_pages: DEFAULT_MAX_EMPTY_PAGES,
        };
        let e = connect("http://example.com/x", &limits)
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("unsupported URL scheme http://")));
        let e = connect("s3:///nobucket", &limits).err().map(|e| e.message);
        assert!(e.is_some_and(|m| m.contains("no bucket")), "bucket");
    }

    #[test]
    fn a_bucket_url_connects_without_any_request() {
        let limits = Limits {
            timeout: Duration::from_secs(1),
            retries: 0,
            max_empty_pages: DEFAULT_MAX_EMPTY_PAGES,
        };
        let r = connect("s3://bucket/runs/team/", &limits);
        let r = r.ok().filter(|r| r.prefix.as_ref() == "runs/team");
        assert!(r.is_some_and(|r| r.url == "s3://bucket/runs/team"));
    }
}
