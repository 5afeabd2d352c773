//! The attempts of one call: URL and headers, the per-request timeout,
//! acquire's single retry, status-to-error mapping and reading bodies.
//! Every operation ([`crate::ops`]) goes through [`Transport::send`], which
//! builds its request and, for a retry, builds it again from the same inputs. The
//! attempts themselves are carried by a [`Wire`] (reqwest in production).

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderValue, AUTHORIZATION, RETRY_AFTER};
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, InvalidReason, InvalidResponse, Result, TransportError, TransportKind};
use crate::error_body::api_error;
use crate::http_client::{own_client, Route, DEFAULT_HEADERS};
use crate::http_date::{answer_date, retry_after};
use crate::ops::{header_value, Operation, Resource, SuccessBody, REQUEST_ID_HEADER};
use crate::realtime::{Stopwatch, PAUSED_CLOCK};
use crate::retry;
use crate::wire::{ReplyBody, Wire, WireError};

/// Most bytes of a success body the SDK reads; a lease or state is < 200 bytes.
const MAX_SUCCESS_BODY: usize = 64 * 1024;
/// Most bytes of an error body the SDK reads; the rest is dropped.
const MAX_ERROR_BODY: usize = 8 * 1024;
/// When the attempts of one call may run; by default only the client's
/// per-request timeout bounds them.
#[derive(Clone, Copy, Default)]
pub(crate) struct Timing<'a> {
    /// Overrides the client's per-request timeout.
    pub(crate) timeout: Option<Duration>,
    /// No attempt is started at or after this instant (a waiting acquire's
    /// deadline): acquire's retry is then skipped and the first error stands.
    pub(crate) send_by: Option<Instant>,
    /// Every attempt's timeout is cut so that its answer is due by then.
    pub(crate) answer_by: Option<Instant>,
    /// Called as acquire's retry goes out.
    pub(crate) on_retry: Option<&'a (dyn Fn() + Sync)>,
}

/// A decoded success and the server's `Date` header, the server-clock
/// reading a lease was measured against.
#[derive(Debug)]
pub(crate) struct Answer<T> {
    pub(crate) value: T,
    pub(crate) date: Option<DateTime<Utc>>,
    /// An earlier attempt of the same request failed in a way that may
    /// have been applied (acquire's single retry then succeeded): that
    /// attempt may still land after this answer.
    pub(crate) after_uncertain: bool,
}

/// HTTP client, base URL and credential, shared by every clone of a `Client`.
pub(crate) struct Transport {
    /// Carries the requests: the reqwest client in production.
    wire: Box<dyn Wire>,
    base_url: String,
    /// `Bearer <service key>`, marked sensitive.
    auth: HeaderValue,
    timeout: Duration,
    /// The caller's client: what the SDK's own client sets by default
    /// (headers, the timeout) is set on each request instead.
    custom: bool,
    /// Plain http to a host off loopback: the service key crosses a
    /// network unencrypted.
    in_clear: bool,
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
            wire: Box::new(http),
            base_url,
            auth,
            timeout,
            custom,
            in_clear: !route.https && !route.loopback,
        })
    }

    /// The same transport over another wire (a scripted or simulated
    /// network): the policy code does not change.
    pub(crate) fn over(mut self, wire: Box<dyn Wire>) -> Self {
        self.wire = wire;
        self
    }

    pub(crate) fn base_url(&self) -> &str {
        &self.base_url
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn in_clear(&self) -> bool {
        self.in_clear
    }

    /// Sends `op` (acquire: up to twice) and returns its decoded success.
    /// A retry sends the request built again by [`Transport::build`], a pure
    /// function of the operation, the request id and the timeout, so it is
    /// byte-identical (a test compares the bytes). Cheaper than cloning
    /// every acquire's request in case it fails.
    pub(crate) async fn send<O: Operation>(
        &self,
        op: &O,
        request_id: &str,
        timing: Timing<'_>,
        quota: &crate::locks::engine::observe::Quota,
    ) -> Result<Answer<O::Output>> {
        let mut request = self.build(op, request_id, timing.timeout)?;
        let mut first_error: Option<Error> = None;
        let mut attempt = 1;
        loop {
            let may_retry = attempt < O::ATTEMPTS;
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
            let sent = self.attempt(op, request, request_id, &span);
            // A span no subscriber wants is not entered on every poll.
            let mut result = if span.is_disabled() {
                sent.await
            } else {
                sent.instrument(span.clone()).await
            };
            // A paused clock makes every wait for an answer time out at once:
            // say so rather than report a timeout no real time explains (and
            // rather than try again, which would spin). An answer stands.
            if result.is_err() && stopwatch.runtime_ran_ahead() {
                result = Err(paused_clock(request_id));
            }
            // A 429 to any attempt (the retry's too, whose error gives
            // way to the first attempt's unknown outcome) tells the
            // client's waiters and observers to hold back until its window
            // has passed.
            if let Err(err) = &result {
                quota.refused(err, Instant::now());
            }
            let in_time = timing.send_by.is_none_or(|by| Instant::now() < by);
            match (result, may_retry) {
                (Err(err), true) if retry::retries_acquire(&err) && in_time => {
                    span.in_scope(|| {
                        tracing::warn!(error = %err, "retrying acquire once with the same token and request id");
                    });
                    first_error = Some(err).filter(Error::may_have_applied);
                    request = self.build(op, request_id, timing.timeout)?;
                    attempt += 1;
                    if let Some(on_retry) = timing.on_retry {
                        on_retry();
                    }
                }
                // Only a success settles what the first attempt did: any
                // error answers the retry alone (a 409 says the key was
                // another's when the retry came; the first attempt may
                // still land after it), so the first attempt's unknown
                // outcome stays in the error.
                (Err(err), _) if first_error.is_some() => {
                    return Err(match first_error.take() {
                        Some(first) => retry::after_uncertain(first, err),
                        None => err,
                    });
                }
                (Ok(mut answer), _) => {
                    answer.after_uncertain = first_error.as_ref().is_some_and(Error::may_land_late);
                    return Ok(answer);
                }
                (other, _) => return other,
            }
        }
    }

    fn url(&self, key: &str, resource: Resource) -> String {
        let mut url = String::with_capacity(self.base_url.len() + key.len() + 16);
        url.push_str(&self.base_url);
        url.push_str("/locks/");
        encode_path_segment(key, &mut url);
        if resource == Resource::Lease {
            url.push_str("/lease");
        }
        url
    }

    /// Builds the request for `op` exactly as it goes on the wire. In
    /// place, not through reqwest's by-value builder, whose every call
    /// moves the whole request.
    pub(crate) fn build<O: Operation>(
        &self,
        op: &O,
        request_id: &str,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Request> {
        let unbuildable =
            |e: &dyn std::fmt::Display| Error::invalid(format!("could not build the request: {e}"));
        let url =
            reqwest::Url::parse(&self.url(op.key(), O::RESOURCE)).map_err(|e| unbuildable(&e))?;
        if !url.has_host() {
            return Err(unbuildable(&"the URL has no host"));
        }
        let mut request = reqwest::Request::new(O::METHOD, url);
        let headers = request.headers_mut();
        headers.insert(AUTHORIZATION, self.auth.clone());
        headers.insert(REQUEST_ID_HEADER, header_value(request_id, "request_id")?);
        op.prepare(&mut request)?;
        if let Some(timeout) = timeout {
            *request.timeout_mut() = Some(timeout);
        }
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
        span: &tracing::Span,
    ) -> Result<Answer<O::Output>> {
        let mut reply = self
            .wire
            .send(request)
            .await
            .map_err(|e| transport_error(e, request_id, &self.base_url))?;
        let status = reply.status;
        if !span.is_disabled() {
            span.record("status", status.as_u16());
        }

        if status == O::SUCCESS {
            let date = if O::NEEDS_DATE {
                answer_date(&reply.headers)
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
            let limit = O::Body::LIMIT.min(MAX_SUCCESS_BODY);
            let bytes = if limit == 0 {
                Vec::new()
            } else {
                let (bytes, complete) = read_body(&mut *reply.body, limit, request_id).await?;
                if !complete {
                    return Err(invalid(InvalidReason::TooLarge));
                }
                bytes
            };
            let body = O::Body::parse(&bytes).map_err(invalid)?;
            let value = op.decode(body).map_err(invalid)?;
            tracing::debug!("lock call succeeded");
            return Ok(Answer {
                value,
                date,
                after_uncertain: false,
            });
        }

        let headers = &reply.headers;
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, || answer_date(headers)));
        let (bytes, _) = read_body(&mut *reply.body, MAX_ERROR_BODY, request_id).await?;
        let error = Error::from_status(api_error(status.as_u16(), &bytes, request_id, retry_after));
        tracing::debug!(error = %error, "lock call failed");
        Err(error)
    }
}

fn transport_error(err: WireError, request_id: &str, base_url: &str) -> Error {
    let server = (err.kind == TransportKind::Connect).then(|| origin(base_url));
    Error::Transport(TransportError {
        kind: err.kind,
        request_id: request_id.to_owned(),
        server,
        source: Some(err.source),
    })
}

/// `scheme://host:port` of the base URL (no path, no credentials).
fn origin(base_url: &str) -> String {
    match url::Url::parse(base_url) {
        Ok(url) => {
            let host = url.host_str().unwrap_or_default();
            match url.port_or_known_default() {
                Some(port) => format!("{}://{host}:{port}", url.scheme()),
                None => format!("{}://{host}", url.scheme()),
            }
        }
        Err(_) => "the configured URL".to_owned(),
    }
}

/// An attempt timed by a paused runtime clock: sent, its outcome unknown.
fn paused_clock(request_id: &str) -> Error {
    Error::Transport(TransportError {
        kind: TransportKind::PausedClock,
        request_id: request_id.to_owned(),
        server: None,
        source: Some(PAUSED_CLOCK.into()),
    })
}

/// Reads at most `limit` bytes of the body; the flag says whether it all fit.
async fn read_body(
    body: &mut dyn ReplyBody,
    limit: usize,
    request_id: &str,
) -> Result<(Vec<u8>, bool)> {
    let expected = body.content_length().unwrap_or(0).min(limit as u64);
    let mut bytes = Vec::with_capacity(expected as usize);
    while let Some(chunk) = body
        .chunk()
        .await
        .map_err(|e| transport_error(e, request_id, ""))?
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
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use reqwest::StatusCode;

    use super::*;
    use crate::wire::{Reply, WireFuture};

    /// A request as it reached the wire: method, URL, headers, body.
    type Sent = (String, String, Vec<(String, String)>, Vec<u8>);
    /// A scripted answer: status and body, or a failure of that kind.
    type Script = Result<(u16, &'static str), TransportKind>;

    /// A wire that records what it is given and answers from a script.
    #[derive(Clone, Default)]
    struct Scripted {
        sent: Arc<Mutex<Vec<Sent>>>,
        answers: Arc<Mutex<VecDeque<Script>>>,
    }

    struct Chunks(VecDeque<Bytes>);

    impl ReplyBody for Chunks {
        fn content_length(&self) -> Option<u64> {
            None
        }

        fn chunk(&mut self) -> WireFuture<'_, Result<Option<Bytes>, WireError>> {
            let next = self.0.pop_front();
            Box::pin(async move { Ok(next) })
        }
    }

    impl Wire for Scripted {
        fn send(&self, request: reqwest::Request) -> WireFuture<'_, Result<Reply, WireError>> {
            let headers = request
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
                .collect();
            let body = request
                .body()
                .and_then(reqwest::Body::as_bytes)
                .unwrap_or_default()
                .to_vec();
            self.sent.lock().unwrap().push((
                request.method().to_string(),
                request.url().to_string(),
                headers,
                body,
            ));
            let answer = self.answers.lock().unwrap().pop_front().expect("scripted");
            Box::pin(async move {
                match answer {
                    Ok((status, body)) => Ok(Reply {
                        status: StatusCode::from_u16(status).unwrap(),
                        // A 429 names its window, as the service's does.
                        headers: {
                            let mut headers = reqwest::header::HeaderMap::new();
                            if status == 429 {
                                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
                            }
                            headers
                        },
                        body: Box::new(Chunks(VecDeque::from([Bytes::from_static(
                            body.as_bytes(),
                        )]))),
                    }),
                    Err(kind) => Err(WireError {
                        kind,
                        source: "scripted failure".into(),
                    }),
                }
            })
        }
    }

    fn transport(wire: &Scripted) -> Transport {
        let route = Route {
            https: false,
            loopback: true,
        };
        let auth = HeaderValue::from_static("Bearer key");
        Transport::new(
            "http://127.0.0.1:1".to_owned(),
            auth,
            Duration::from_secs(5),
            None,
            route,
        )
        .unwrap()
        .over(Box::new(wire.clone()))
    }

    const TOKEN: &str = "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10";
    const REQUEST_ID: &str = "11111111-2222-4333-8444-555555555555";

    #[tokio::test]
    async fn over_any_wire_acquire_is_replayed_byte_for_byte_after_a_lost_answer() {
        let wire = Scripted::default();
        wire.answers.lock().unwrap().extend([
            Err(TransportKind::Io),
            Ok((
                201,
                r#"{"fencing_token":7,"expires_at":"2026-12-01T12:00:30Z"}"#,
            )),
        ]);
        let op = crate::ops::Acquire {
            key: "build:queue",
            token: TOKEN,
            ttl_secs: 30,
        };
        let answer = transport(&wire)
            .send(&op, REQUEST_ID, Timing::default(), &Default::default())
            .await
            .unwrap();
        assert_eq!(answer.value.fencing_token(), 7);
        let sent = wire.sent.lock().unwrap();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0], sent[1], "the retry is the same request");
        let (method, url, headers, body) = &sent[0];
        assert_eq!(method, "POST");
        assert_eq!(url, "http://127.0.0.1:1/locks/build%3Aqueue/lease");
        assert!(headers.contains(&("x-volcano-lock-token".to_owned(), TOKEN.to_owned())));
        assert_eq!(body, br#"{"ttl_seconds":30}"#);
    }

    /// A 429 to an acquire's retry spends the client's quota, though the
    /// error returned is the first attempt's unknown outcome.
    #[tokio::test]
    async fn a_429_to_the_retry_spends_the_quota() {
        let wire = Scripted::default();
        wire.answers.lock().unwrap().extend([
            Err(TransportKind::Io),
            Ok((429, r#"{"error":"slow down","code":"lock_rate_limited"}"#)),
        ]);
        let op = crate::ops::Acquire {
            key: "job",
            token: TOKEN,
            ttl_secs: 30,
        };
        let quota = crate::locks::engine::observe::Quota::default();
        let err = transport(&wire)
            .send(&op, REQUEST_ID, Timing::default(), &quota)
            .await
            .unwrap_err();
        assert!(
            err.may_have_been_applied(),
            "the first attempt's outcome: {err:?}"
        );
        assert!(
            quota.quiet_until().is_some(),
            "the retry's 429 was not counted"
        );
    }

    #[tokio::test]
    async fn over_any_wire_other_operations_are_sent_once_and_errors_mapped() {
        let wire = Scripted::default();
        wire.answers
            .lock()
            .unwrap()
            .extend([Err(TransportKind::Timeout)]);
        let get = || async {
            let op = crate::ops::Get { key: "job" };
            transport(&wire)
                .send(&op, REQUEST_ID, Timing::default(), &Default::default())
                .await
                .unwrap_err()
        };
        let err = get().await;
        assert!(
            matches!(&err, Error::Transport(t) if t.is_timeout()),
            "{err:?}"
        );
        assert_eq!(err.request_id(), Some(REQUEST_ID));
        wire.answers
            .lock()
            .unwrap()
            .extend([Ok((409, r#"{"error":"held","code":"lock_held"}"#))]);
        let err = get().await;
        assert!(err.is_lock_held(), "{err:?}");
        assert_eq!(wire.sent.lock().unwrap().len(), 2);
    }

    #[test]
    fn encodes_only_colon_of_the_key_alphabet() {
        let mut out = String::new();
        encode_path_segment("build:queue.v1_a-b", &mut out);
        assert_eq!(out, "build%3Aqueue.v1_a-b");
    }
}
