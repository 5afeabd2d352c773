//! The one place that talks to the service: URL and headers, the per-request
//! timeout, acquire's single retry, status-to-error mapping and reading bodies.
//! Every operation ([`crate::ops`]) goes through [`Transport::send`], which
//! builds its request once and replays that very request for a retry.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::DATE;
use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER,
};
use serde_json::{Map, Value};
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{
    ApiError, Error, InvalidReason, InvalidResponse, Result, TransportError, TransportKind,
};
use crate::ops::{header_value, Operation};
use crate::realtime::{Stopwatch, PAUSED_CLOCK};
use crate::retry;

/// Header carrying the request id (all five operations).
pub(crate) const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-volcano-request-id");
/// Header carrying the ownership token (acquire, renew, release).
pub(crate) const LOCK_TOKEN_HEADER: HeaderName = HeaderName::from_static("x-volcano-lock-token");

/// Most bytes of a success body the SDK reads; a lease or state is < 200 bytes.
const MAX_SUCCESS_BODY: usize = 64 * 1024;
/// Most bytes of an error body the SDK reads; the rest is dropped.
const MAX_ERROR_BODY: usize = 8 * 1024;
/// Most characters of a non-JSON error body kept as the message.
const MAX_ERROR_TEXT: usize = 512;

/// When the attempts of one call may run; by default only the client's
/// per-request timeout bounds them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Timing {
    /// Overrides the client's per-request timeout.
    pub(crate) timeout: Option<Duration>,
    /// No attempt is started at or after this instant (a waiting acquire's
    /// deadline): acquire's retry is then skipped and the first error stands.
    pub(crate) send_by: Option<Instant>,
    /// Every attempt's timeout is cut so that its answer is due by then.
    pub(crate) answer_by: Option<Instant>,
}

/// A decoded success and the server's `Date` header, the server-clock
/// reading a lease was measured against.
#[derive(Debug)]
pub(crate) struct Answer<T> {
    pub(crate) value: T,
    pub(crate) date: Option<DateTime<Utc>>,
}

/// HTTP client, base URL and credential, shared by every clone of a `Client`.
pub(crate) struct Transport {
    http: reqwest::Client,
    base_url: String,
    /// `Bearer <service key>`, marked sensitive.
    auth: HeaderValue,
    timeout: Duration,
    /// The caller's client: what the SDK's own client sets by default
    /// (headers, the timeout) is set on each request instead.
    custom: bool,
}

const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// Sent on every request, body or not, as the reference SDKs do.
const DEFAULT_HEADERS: [(HeaderName, HeaderValue); 2] = [(ACCEPT, JSON), (CONTENT_TYPE, JSON)];

fn default_headers() -> HeaderMap {
    HeaderMap::from_iter(DEFAULT_HEADERS)
}

/// Where the service is, as the SDK's own client needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub(crate) https: bool,
    /// On this machine: `localhost`, `127.0.0.0/8`, `::1`.
    pub(crate) loopback: bool,
}

/// The SDK's own client. Proxies come from the standard variables
/// (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`) and, on macOS and
/// Windows, the system settings, except for a service on loopback: a proxy
/// cannot reach this machine's loopback, and would see the service key of a
/// plain-http local server. Certificates are checked against the OS trust
/// store (`SSL_CERT_FILE` and `SSL_CERT_DIR` replace it on Linux), which is
/// not even loaded for a plain-http service on loopback (the mock server),
/// so tests run in an image without CA certificates.
fn own_client(timeout: Duration, route: Route) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder();
    if route.loopback {
        builder = builder.no_proxy();
    }
    // No TLS at all: no proxy, no https.
    #[cfg(any(feature = "tls-aws-lc-rs", feature = "tls-ring"))]
    let plain_local = route.loopback && !route.https;
    #[cfg(all(feature = "tls-aws-lc-rs", not(feature = "tls-ring")))]
    if plain_local {
        builder = builder.tls_certs_only([]);
    }
    // reqwest ignores its own TLS options (versions, roots, SNI) for a
    // configuration given whole: set them in `tls::ring_config`.
    #[cfg(feature = "tls-ring")]
    {
        builder = builder.tls_backend_preconfigured(tls::ring_config(plain_local)?);
    }
    let builder = builder
        .default_headers(default_headers())
        .user_agent(concat!("volcano-rust/", env!("CARGO_PKG_VERSION")))
        .timeout(timeout)
        // A redirect would carry the service key elsewhere; report it instead.
        .redirect(reqwest::redirect::Policy::none());
    builder
        .build()
        .map_err(|e| client_failed(&crate::error::chain(&e)))
}

/// Building a client fails mostly on TLS: say where trust comes from.
fn client_failed(reason: &str) -> Error {
    Error::invalid(format!(
        "could not build the HTTP client: {reason} (certificates come from the OS trust \
         store, or from SSL_CERT_FILE and SSL_CERT_DIR when set)"
    ))
}

/// TLS with ring, configured here rather than through a process-wide
/// default provider, which would change what other rustls users in the
/// process get.
#[cfg(feature = "tls-ring")]
mod tls {
    use std::sync::Arc;

    use rustls::crypto::ring;
    use rustls::ClientConfig;

    use crate::error::Result;

    /// `plain_local`: no TLS will be spoken, so no trust store is loaded.
    pub(super) fn ring_config(plain_local: bool) -> Result<ClientConfig> {
        let provider = Arc::new(ring::default_provider());
        let failed = |e: rustls::Error| super::client_failed(&e.to_string());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(failed)?;
        let builder = if plain_local {
            builder.with_root_certificates(rustls::RootCertStore::empty())
        } else {
            let verifier = rustls_platform_verifier::Verifier::new(provider).map_err(failed)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        };
        let mut config = builder.with_no_client_auth();
        // What reqwest offers with its own configuration.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

impl Transport {
    /// `http`: the caller's own client ([`crate::ClientBuilder::http_client`]),
    /// or `None` for the SDK's.
    pub(crate) fn new(
        base_url: String,
        auth: HeaderValue,
        timeout: Duration,
        http: Option<reqwest::Client>,
        route: Route,
    ) -> Result<Self> {
        let custom = http.is_some();
        let http = match http {
            Some(http) => http,
            None => own_client(timeout, route)?,
        };
        Ok(Transport {
            http,
            base_url,
            auth,
            timeout,
            custom,
        })
    }

    pub(crate) fn base_url(&self) -> &str {
        &self.base_url
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `op` (acquire: up to twice) and returns its decoded success.
    /// The request is built once; a retry sends a clone of it, so it is
    /// byte-identical by construction.
    pub(crate) async fn send<O: Operation>(
        &self,
        op: &O,
        request_id: &str,
        timing: Timing,
    ) -> Result<Answer<O::Output>> {
        let mut request = self.build(op, request_id, timing.timeout)?;
        let mut first_error: Option<Error> = None;
        let mut attempt = 1;
        loop {
            let replay = if attempt < O::ATTEMPTS {
                request.try_clone()
            } else {
                None
            };
            if let Some(by) = timing.answer_by {
                let left = by.saturating_duration_since(Instant::now());
                let cut = request.timeout().copied().unwrap_or(self.timeout).min(left);
                *request.timeout_mut() = Some(cut.max(Duration::from_millis(1)));
            }
            let span = tracing::debug_span!(
                "volcano.lock",
                op = O::NAME,
                key = op.key(),
                request_id,
                attempt,
                status = tracing::field::Empty,
            );
            let stopwatch = Stopwatch::start();
            let result = self
                .attempt(op, request, request_id)
                .instrument(span.clone())
                .await;
            // A paused clock makes every wait for an answer time out at once.
            assert!(!stopwatch.runtime_ran_ahead(), "volcano: {PAUSED_CLOCK}");
            let in_time = timing.send_by.is_none_or(|by| Instant::now() < by);
            match (result, replay) {
                (Err(err), Some(again)) if retry::retries_acquire(&err) && in_time => {
                    span.in_scope(|| {
                        tracing::info!(error = %err, "retrying acquire once with the same token and request id");
                    });
                    first_error = Some(err).filter(Error::may_have_applied);
                    request = again;
                    attempt += 1;
                }
                // The retry's answer settles ownership only as a success or
                // a 409 (or by being just as uncertain); anything else (a
                // 429, a 401) says nothing about the first attempt, whose
                // unknown outcome then stands.
                (Err(err), _) if first_error.is_some() && !retry::settles(&err) => {
                    return Err(first_error.take().unwrap_or(err));
                }
                (other, _) => return other,
            }
        }
    }

    fn url(&self, key: &str, on_lease: bool) -> String {
        let mut url = String::with_capacity(self.base_url.len() + key.len() + 16);
        url.push_str(&self.base_url);
        url.push_str("/locks/");
        encode_path_segment(key, &mut url);
        if on_lease {
            url.push_str("/lease");
        }
        url
    }

    /// Builds the request for `op` exactly as it goes on the wire.
    pub(crate) fn build<O: Operation>(
        &self,
        op: &O,
        request_id: &str,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Request> {
        let mut request = self
            .http
            .request(O::METHOD, self.url(op.key(), O::ON_LEASE))
            .header(AUTHORIZATION, self.auth.clone())
            .header(REQUEST_ID_HEADER, header_value(request_id, "request_id")?);
        request = op.prepare(request)?;
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        let mut request = request
            .build()
            .map_err(|e| Error::invalid(format!("could not build the request: {e}")))?;
        if self.custom {
            for (name, value) in DEFAULT_HEADERS {
                request.headers_mut().entry(name).or_insert(value);
            }
            let timeout = request.timeout().copied().unwrap_or(self.timeout);
            *request.timeout_mut() = Some(timeout);
        }
        Ok(request)
    }

    async fn attempt<O: Operation>(
        &self,
        op: &O,
        request: reqwest::Request,
        request_id: &str,
    ) -> Result<Answer<O::Output>> {
        let mut response = self
            .http
            .execute(request)
            .await
            .map_err(|e| transport_error(e, request_id))?;
        let status = response.status();
        tracing::Span::current().record("status", status.as_u16());

        if status == O::SUCCESS {
            let date = if O::NEEDS_DATE {
                answer_date(response.headers())
            } else {
                None
            };
            let invalid = |reason| {
                Error::InvalidResponse(InvalidResponse {
                    reason,
                    status: status.as_u16(),
                    request_id: request_id.to_owned(),
                })
            };
            let body = if O::HAS_BODY {
                let (bytes, complete) =
                    read_body(&mut response, MAX_SUCCESS_BODY, request_id).await?;
                if !complete {
                    return Err(invalid(InvalidReason::TooLarge));
                }
                Some(json_object(&bytes).ok_or_else(|| invalid(InvalidReason::NotAnObject))?)
            } else {
                None
            };
            let value = op.decode(body).map_err(invalid)?;
            tracing::debug!("lock call succeeded");
            return Ok(Answer { value, date });
        }

        let headers = response.headers();
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, || answer_date(headers)));
        let (bytes, _) = read_body(&mut response, MAX_ERROR_BODY, request_id).await?;
        let error = Error::from_status(api_error(status.as_u16(), &bytes, request_id, retry_after));
        tracing::debug!(error = %error, "lock call failed");
        Err(error)
    }
}

/// The body as a JSON object, if it is one.
pub(crate) fn json_object(bytes: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

/// Parses an HTTP `Date` header (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37
/// GMT`); other forms are ignored.
fn http_date(value: &str) -> Option<DateTime<Utc>> {
    let value = value.trim();
    imf_fixdate(value).or_else(|| {
        DateTime::parse_from_rfc2822(value)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    })
}

/// The one form servers send (RFC 9110 IMF-fixdate, `Sun, 06 Nov 1994
/// 08:49:37 GMT`), read by position: about a fifth of the general parser's
/// instructions. Anything else, a weekday that does not match the date
/// included, falls to the general parser, which then decides.
fn imf_fixdate(value: &str) -> Option<DateTime<Utc>> {
    use chrono::Datelike;
    const WEEKDAYS: [&[u8; 3]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
    let b = value.as_bytes();
    if b.len() != 29 || &b[3..5] != b", " || &b[25..] != b" GMT" {
        return None;
    }
    let number = |from: usize, len: usize| -> Option<u32> {
        b[from..from + len].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let month = MONTHS.iter().position(|m| m[..] == b[8..11])? as u32 + 1;
    if b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || b[19] != b':' || b[22] != b':' {
        return None;
    }
    let date = chrono::NaiveDate::from_ymd_opt(number(12, 4)? as i32, month, number(5, 2)?)?;
    if WEEKDAYS[date.weekday().num_days_from_monday() as usize][..] != b[..3] {
        return None;
    }
    let time = chrono::NaiveTime::from_hms_opt(number(17, 2)?, number(20, 2)?, number(23, 2)?)?;
    Some(date.and_time(time).and_utc())
}

/// The answer's `Date`: the server's clock when it answered.
fn answer_date(headers: &HeaderMap) -> Option<DateTime<Utc>> {
    headers
        .get(DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(http_date)
}

/// `Retry-After` as delay-seconds or as an HTTP-date. A date is measured
/// from the answer's own `Date` (both on the server's clock) when there is
/// one, else from this machine's clock; a date already past is zero.
fn retry_after(value: &str, date: impl FnOnce() -> Option<DateTime<Utc>>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = http_date(value)?;
    let from = date().unwrap_or_else(Utc::now);
    Some((at - from).to_std().unwrap_or(Duration::ZERO))
}

fn transport_error(err: reqwest::Error, request_id: &str) -> Error {
    let kind = if err.is_timeout() {
        TransportKind::Timeout
    } else if err.is_connect() {
        TransportKind::Connect
    } else {
        TransportKind::Io
    };
    Error::Transport(TransportError {
        kind,
        request_id: request_id.to_owned(),
        source: Some(Box::new(err.without_url())),
    })
}

/// Reads at most `limit` bytes of the body; the flag says whether it all fit.
async fn read_body(
    response: &mut reqwest::Response,
    limit: usize,
    request_id: &str,
) -> Result<(Vec<u8>, bool)> {
    let expected = response.content_length().unwrap_or(0).min(limit as u64);
    let mut bytes = Vec::with_capacity(expected as usize);
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| transport_error(e, request_id))?
    {
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok((bytes, false));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((bytes, true))
}

/// Builds the API error from an error body: the JSON envelope's `error` and
/// `code` when it is one, else a truncated copy of the text. The status is
/// always kept.
fn api_error(
    status: u16,
    body: &[u8],
    request_id: &str,
    retry_after: Option<Duration>,
) -> ApiError {
    let (message, code) = match json_object(body) {
        Some(map) => {
            let message = ["error", "message"]
                .iter()
                .find_map(|name| map.get(*name).and_then(Value::as_str))
                .map(|m| truncate(m, MAX_ERROR_TEXT))
                .unwrap_or_else(|| "the error body has no message".to_owned());
            let code = match map.get("code") {
                Some(Value::String(code)) => Some(truncate(code, MAX_ERROR_TEXT)),
                Some(Value::Number(code)) => Some(code.to_string()),
                _ => None,
            };
            (message, code)
        }
        None if body.iter().all(u8::is_ascii_whitespace) => {
            ("the error body is empty".to_owned(), None)
        }
        None => (
            truncate(&String::from_utf8_lossy(body), MAX_ERROR_TEXT),
            None,
        ),
    };
    ApiError {
        status: Some(status),
        code,
        message,
        request_id: Some(request_id.to_owned()),
        retry_after,
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so a valid
/// key changes only at `:` (`build:queue` → `build%3Aqueue`).
fn encode_path_segment(segment: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
    // Most keys need no escaping: one copy instead of a push per byte.
    if segment.bytes().all(unreserved) {
        out.push_str(segment);
        return;
    }
    for &b in segment.as_bytes() {
        if unreserved(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_read_fast_agree_with_the_general_parser() {
        let general = |v: &str| {
            DateTime::parse_from_rfc2822(v)
                .ok()
                .map(|t| t.with_timezone(&Utc))
        };
        for v in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Mon, 30 Nov 2026 12:00:00 GMT",
            "Tue, 29 Feb 2028 23:59:59 GMT",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            assert!(imf_fixdate(v).is_some(), "{v}");
            assert_eq!(imf_fixdate(v), general(v), "{v}");
        }
        for v in [
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nox 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08-49-37 GMT",
            "Sun, 06 Nov +994 08:49:37 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "sun, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 23:59:60 GMT",
        ] {
            assert_eq!(imf_fixdate(v), None, "{v}");
        }
        // Where the fast path declines, the answer is the general parser's.
        for v in [
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 23:59:60 GMT",
        ] {
            assert_eq!(http_date(v), general(v), "{v}");
        }
        // Other RFC 2822 forms still parse, through the general parser.
        assert_eq!(
            http_date("Sun, 6 Nov 1994 08:49:37 +0000"),
            general("Sun, 06 Nov 1994 08:49:37 GMT")
        );
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_a_date_on_the_servers_clock() {
        let date = http_date("Mon, 30 Nov 2026 12:00:00 GMT");
        assert_eq!(retry_after(" 7 ", || date), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after("Mon, 30 Nov 2026 12:00:30 GMT", || date),
            Some(Duration::from_secs(30)),
            "from the answer's Date, not this machine's clock"
        );
        assert_eq!(
            retry_after("Mon, 30 Nov 2026 11:59:00 GMT", || date),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", || date), None);
        assert_eq!(retry_after("-3", || date), None);
    }

    #[test]
    fn encodes_only_colon_of_the_key_alphabet() {
        let mut out = String::new();
        encode_path_segment("build:queue.v1_a-b", &mut out);
        assert_eq!(out, "build%3Aqueue.v1_a-b");
    }

    #[test]
    fn non_json_error_body_keeps_status_and_truncated_text() {
        let body = "x".repeat(2000);
        let api = api_error(502, body.as_bytes(), "rid", None);
        assert_eq!(api.status, Some(502));
        assert_eq!(api.message.chars().count(), MAX_ERROR_TEXT + 1);
        assert!(api.code.is_none());
    }

    #[test]
    fn parses_the_date_header() {
        let date = http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(date.to_rfc3339(), "1994-11-06T08:49:37+00:00");
        assert_eq!(http_date("yesterday"), None);
    }

    #[test]
    fn envelope_falls_back_to_message_member() {
        let api = api_error(400, br#"{"message":"bad ttl","code":7}"#, "rid", None);
        assert_eq!(api.message, "bad ttl");
        assert_eq!(api.code.as_deref(), Some("7"));
    }
}
