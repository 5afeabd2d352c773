//! The SDK's requests over the simulated network: one simulated TCP
//! connection per request, HTTP/1.1 through hyper, the request's timeout
//! on simulated time.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use volcano::sim::{Answer, Failure, Network};
use volcano_mock_server::Operation;

/// How long after an attempt's own window (`sent + timeout`) a try of it
/// may still be applied and be bounded by its client: the SDK's undo
/// releases again once `unknown + timeout + LATE_MARGIN` has passed (its
/// outcome became unknown at or after it was sent). A try applied later
/// (held in the network, or behind a gateway, for longer) is beyond what
/// a client can bound: the checks excuse it, by name, and count it.
pub(crate) const LATE_MARGIN: Duration = Duration::from_secs(2);

/// The server's name on the simulated network, and its port.
pub(crate) const SERVER: &str = "server";
pub(crate) const PORT: u16 = 80;

/// What the clients sent, as the network saw it: who sent each request id
/// (so that the server's journal can be read per client), and every
/// attempt, whether or not it arrived, with the answer it got (the
/// clients' side of the history).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sent {
    /// Who sent each request id, and when it was first sent.
    pub(crate) by_id: HashMap<String, (usize, Duration)>,
    /// Every attempt, in the order sent.
    pub(crate) attempts: Vec<Attempt>,
}

/// One attempt of a request, as its client saw it.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    pub(crate) client: usize,
    pub(crate) request_id: String,
    pub(crate) operation: Operation,
    pub(crate) key: String,
    /// The lock token sent (acquire, renew, release).
    pub(crate) token: Option<String>,
    /// The `ttl_seconds` sent (acquire, renew).
    pub(crate) ttl_seconds: Option<i64>,
    /// When it was sent (simulated time).
    pub(crate) sent: Duration,
    /// Its request timeout as it went out: the operation's `.timeout(..)`
    /// or the client's, cut to a wait's deadline. Its client gives it up
    /// by `sent + timeout`; a try of it applied later than `sent + timeout
    /// + LATE_MARGIN` is beyond what a client can bound.
    pub(crate) timeout: Duration,
    /// The answer, if one came back whole.
    pub(crate) answer: Option<Observed>,
    /// When its client saw it fail without an answer (no connection, a
    /// broken one, its timeout), if it did.
    pub(crate) failed: Option<Duration>,
    /// The status of a success whose body could not be read (not a JSON
    /// object): recorded as a failure in `failed`, since its client
    /// learns no outcome from it, only that the service answered.
    pub(crate) garbled: Option<u16>,
}

/// An answer a client received.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    /// When it was received (simulated time).
    pub(crate) at: Duration,
    pub(crate) status: u16,
    /// The body's `fencing_token`, if it had one.
    pub(crate) fence: Option<i64>,
    /// Its `Retry-After`, in seconds, if it had one.
    pub(crate) retry_after: Option<Duration>,
    /// What a lease in it had left on the service's clock: its
    /// `expires_at` less the answer's `Date` (a lease granted by an
    /// attempt applied before this one reads less than its ttl).
    pub(crate) left: Option<Duration>,
    /// Whether its body was a JSON object (the service's envelope, or a
    /// lease): a 409 without one is not the service saying "held".
    pub(crate) json: bool,
}

/// The operation and key of a lock request's path and method.
fn operation(method: &reqwest::Method, path: &str) -> Option<(Operation, String)> {
    let rest = path.strip_prefix("/locks/")?;
    let (key, lease) = match rest.strip_suffix("/lease") {
        Some(key) => (key, true),
        None => (rest, false),
    };
    // The SDK percent-encodes what a path segment may not carry as is
    // (`:` in a semaphore's permit keys); the server's journal decodes.
    let key = &decode(key);
    let op = match (method.as_str(), lease) {
        ("POST", true) => Operation::Acquire,
        ("PATCH", true) => Operation::Renew,
        ("DELETE", true) => Operation::Release,
        ("GET", false) => Operation::Get,
        ("DELETE", false) => Operation::ForceRelease,
        _ => return None,
    };
    Some((op, key.to_owned()))
}

/// A JSON body's integer member `name`.
/// A lease's `expires_at` less the answer's `Date`.
fn time_left(body: &[u8], headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let expires = chrono::DateTime::parse_from_rfc3339(value.get("expires_at")?.as_str()?).ok()?;
    let date = chrono::DateTime::parse_from_rfc2822(headers.get("date")?.to_str().ok()?).ok()?;
    (expires - date).to_std().ok()
}

fn member(body: &[u8], name: &str) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get(name)?.as_i64()
}

pub(crate) type Senders = Arc<Mutex<Sent>>;

/// Carries a client's requests to [`SERVER`].
pub(crate) struct SimNetwork {
    pub(crate) client: usize,
    /// The client's per-request timeout, for requests that carry none.
    pub(crate) timeout: Duration,
    pub(crate) senders: Senders,
    /// Counts the lock requests this client has sent, so that its program
    /// can drop an operation while one is in flight.
    pub(crate) sent_count: tokio::sync::watch::Sender<u64>,
}

impl Network for SimNetwork {
    fn send(
        &self,
        request: reqwest::Request,
    ) -> Pin<Box<dyn Future<Output = Result<Answer, Failure>> + Send + '_>> {
        let timeout = request.timeout().copied().unwrap_or(self.timeout);
        let attempt = self.record(&request, timeout);
        if attempt.is_some() {
            self.sent_count.send_modify(|n| *n += 1);
        }
        let senders = self.senders.clone();
        Box::pin(async move {
            let answer = match tokio::time::timeout(timeout, exchange(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(Failure::Timeout),
            };
            let at = turmoil::sim_elapsed().unwrap_or_default();
            match (&answer, attempt) {
                (Ok(answer), Some(index)) if unreadable(answer.status, &answer.body) => {
                    let mut sent = crate::lock(&senders);
                    sent.attempts[index].failed = Some(at);
                    sent.attempts[index].garbled = Some(answer.status);
                }
                (Ok(answer), Some(index)) => {
                    let observed = Observed {
                        at,
                        status: answer.status,
                        fence: member(&answer.body, "fencing_token"),
                        left: time_left(&answer.body, &answer.headers),
                        retry_after: answer
                            .headers
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.trim().parse::<u64>().ok())
                            .map(Duration::from_secs),
                        json: serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(
                            &answer.body,
                        )
                        .is_ok(),
                    };
                    crate::lock(&senders).attempts[index].answer = Some(observed);
                }
                (Err(_), Some(index)) => crate::lock(&senders).attempts[index].failed = Some(at),
                (_, None) => {}
            }
            answer
        })
    }
}

impl SimNetwork {
    /// Notes who sent `request`, and the attempt; returns the attempt's
    /// index when it is a lock request.
    fn record(&self, request: &reqwest::Request, timeout: Duration) -> Option<usize> {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let id = header("x-volcano-request-id").unwrap_or_default();
        let now = turmoil::sim_elapsed().unwrap_or_default();
        let mut sent = crate::lock(&self.senders);
        sent.by_id.entry(id.clone()).or_insert((self.client, now));
        let (operation, key) = operation(request.method(), request.url().path())?;
        let body = request.body().and_then(reqwest::Body::as_bytes);
        sent.attempts.push(Attempt {
            client: self.client,
            request_id: id,
            operation,
            key,
            token: header("x-volcano-lock-token"),
            ttl_seconds: body.and_then(|b| member(b, "ttl_seconds")),
            sent: now,
            timeout,
            answer: None,
            failed: None,
            garbled: None,
        });
        Some(sent.attempts.len() - 1)
    }
}

/// A success whose body is there and is not a JSON object (a proxy's
/// page): the client cannot read the outcome. (An error status says what
/// it says without its body.)
fn unreadable(status: u16, body: &[u8]) -> bool {
    (200..300).contains(&status)
        && !body.is_empty()
        && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body).is_err()
}

/// One request and its whole answer on a fresh connection.
async fn exchange(request: reqwest::Request) -> Result<Answer, Failure> {
    let stream = turmoil::net::TcpStream::connect((SERVER, PORT))
        .await
        .map_err(|_| Failure::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| Failure::Connect)?;
    // Driven beside the request, and stopped with it: also when this
    // future is dropped mid-request (a timeout, an abandoned call).
    let driver = AbortOnDrop(tokio::task::spawn(async move {
        let _ = connection.await;
    }));
    let result = async {
        let response = sender
            .send_request(to_hyper(&request))
            .await
            .map_err(|_| Failure::Io)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|_| Failure::Io)?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
    .await;
    drop(driver);
    result
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The same request as hyper takes it: method, path, headers, body.
fn to_hyper(request: &reqwest::Request) -> hyper::Request<Full<bytes::Bytes>> {
    let url = request.url();
    let mut builder = hyper::Request::builder()
        .method(request.method().clone())
        .uri(url.path())
        .header(hyper::header::HOST, SERVER);
    for (name, value) in request.headers() {
        builder = builder.header(name, value);
    }
    let body = request
        .body()
        .and_then(reqwest::Body::as_bytes)
        .map(bytes::Bytes::copy_from_slice)
        .unwrap_or_default();
    builder
        .body(Full::new(body))
        .expect("a request the SDK built is valid")
}

/// A path segment, percent-decoded.
fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
