//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use volcano::Client;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

pub(crate) const SERVICE_KEY: &str = "svc-key-SECRET-0123456789";
pub(crate) const ANON_KEY: &str = "anon-key-SECRET-abcdef";
pub(crate) const TOKEN: &str = "AAAAAAAA-bbbb-4ccc-8ddd-EEEEEEEEEEEE";
pub(crate) const REQUEST_ID: &str = "11111111-2222-4333-8444-555555555555";
pub(crate) const EXPIRES_AT: &str = "2026-07-20T14:00:10Z";

/// A client for `url` with the test keys and a short timeout.
pub(crate) fn client(url: &str) -> Client {
    client_with_timeout(url, Duration::from_secs(5))
}

pub(crate) fn client_with_timeout(url: &str, timeout: Duration) -> Client {
    Client::builder()
        .anon_key(ANON_KEY)
        .service_key(SERVICE_KEY)
        .api_url(url)
        .timeout(timeout)
        .build()
        .expect("test client")
}

/// A client for a volcano mock server, with its keys.
pub(crate) fn mock_client(server: &volcano_mock_server::MockServer) -> Client {
    Client::builder()
        .anon_key(server.anon_key())
        .service_key(server.service_key())
        .api_url(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .expect("mock server client")
}

/// Answers every `verb` request on `server` with `response`.
pub(crate) async fn mount(
    server: &MockServer,
    verb: &str,
    response: impl wiremock::Respond + 'static,
) {
    Mock::given(wiremock::matchers::method(verb))
        .respond_with(response)
        .mount(server)
        .await;
}

/// A wiremock server whose unmatched requests get a descriptive 418, so a
/// failing test says which request nobody expected.
pub(crate) async fn server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(418)
                .set_body_json(serde_json::json!({"error": "no mock matched this request"})),
        )
        .with_priority(u8::MAX)
        .mount(&server)
        .await;
    server
}

/// A 201/200 lease body whose lease lasts a day past wiremock's `Date`, so
/// a guard's deadline is the ttl it asked for.
pub(crate) fn lease_body(status: u16, fencing_token: i64) -> ResponseTemplate {
    let expires_at = chrono::Utc::now() + chrono::TimeDelta::days(1);
    ResponseTemplate::new(status).set_body_json(serde_json::json!({
        "expires_at": expires_at.to_rfc3339(),
        "fencing_token": fencing_token,
    }))
}

/// Answers the first `n` `verb` requests with a 503 that says
/// `Retry-After: retry_after` (seconds), and the later ones with `then`.
pub(crate) async fn unavailable_then(
    server: &MockServer,
    verb: &str,
    n: u64,
    retry_after: u64,
    then: ResponseTemplate,
) {
    let unavailable = error_body(503, "busy", Some("lock_service_unavailable"))
        .insert_header("retry-after", retry_after.to_string().as_str());
    Mock::given(wiremock::matchers::method(verb))
        .respond_with(unavailable)
        .up_to_n_times(n)
        .with_priority(1)
        .mount(server)
        .await;
    mount(server, verb, then).await;
}

/// A JSON error envelope.
pub(crate) fn error_body(status: u16, message: &str, code: Option<&str>) -> ResponseTemplate {
    let mut body = serde_json::json!({ "error": message });
    if let Some(code) = code {
        body["code"] = code.into();
    }
    ResponseTemplate::new(status).set_body_json(body)
}

/// The requests wiremock received, excluding none.
pub(crate) async fn received(server: &MockServer) -> Vec<wiremock::Request> {
    server.received_requests().await.unwrap_or_default()
}

pub(crate) fn header<'a>(request: &'a wiremock::Request, name: &str) -> Option<&'a str> {
    request.headers.get(name).and_then(|v| v.to_str().ok())
}

/// A TCP server that reads each request in full, records it, then closes
/// the connection without answering: a transport failure after the request
/// was sent.
pub(crate) struct Dropper {
    pub url: String,
    pub requests: Arc<std::sync::Mutex<Vec<String>>>,
    count: Arc<AtomicUsize>,
}

impl Dropper {
    pub(crate) async fn start() -> Dropper {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let (reqs, cnt) = (requests.clone(), count.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n) = socket.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if request_complete(&buf) {
                        break;
                    }
                }
                reqs.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into_owned());
                cnt.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        Dropper {
            url,
            requests,
            count,
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

fn request_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    buf.len() >= end + 4 + length
}

/// Waits until `condition` holds, checking every 10 ms, for at most `limit`.
/// Returns whether it held: a wait on a condition, not a blind sleep.
pub(crate) async fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A wiremock responder that moves a lease clock forward before answering:
/// "this request took `by`" without waiting for it.
pub(crate) struct AdvanceThen {
    pub clock: volcano::LeaseClock,
    pub by: Duration,
    pub response: ResponseTemplate,
}

impl wiremock::Respond for AdvanceThen {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        self.clock.advance(self.by);
        self.response.clone()
    }
}

/// A wiremock responder that answers the n-th request it gets (from 1)
/// with `answer(n)`, and notes when each came.
pub(crate) struct InTurn {
    pub(crate) arrived: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
    answer: Box<dyn Fn(usize) -> ResponseTemplate + Send + Sync>,
}

impl InTurn {
    pub(crate) fn new(answer: impl Fn(usize) -> ResponseTemplate + Send + Sync + 'static) -> Self {
        InTurn {
            arrived: Arc::default(),
            answer: Box::new(answer),
        }
    }
}

impl wiremock::Respond for InTurn {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        let mut arrived = self.arrived.lock().unwrap();
        arrived.push(tokio::time::Instant::now());
        (self.answer)(arrived.len())
    }
}

/// A gateway's own 503 page (not the service's envelope).
pub(crate) fn gateway_page() -> ResponseTemplate {
    ResponseTemplate::new(503).set_body_string("<html>upstream</html>")
}

/// A client whose scoped locks use `clock`.
pub(crate) fn client_with_clock(url: &str, clock: &volcano::LeaseClock) -> Client {
    Client::builder()
        .anon_key(ANON_KEY)
        .service_key(SERVICE_KEY)
        .api_url(url)
        .timeout(Duration::from_secs(5))
        .lease_clock(clock.clone())
        .build()
        .expect("test client")
}

/// The HTTP methods the server received, in order.
pub(crate) async fn methods(server: &MockServer) -> Vec<String> {
    received(server)
        .await
        .iter()
        .map(|r| r.method.to_string())
        .collect()
}

/// Everything a test's `tracing` subscriber writes, for reading back.
#[derive(Clone, Default)]
pub(crate) struct Captured(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures this thread's events up to `level` until the guard drops.
    pub(crate) fn install(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (captured, guard)
    }

    /// The logged lines that contain `what`.
    pub(crate) fn lines(&self, what: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect()
    }
}
pub(crate) mod gateway;

/// Sets a flag when dropped: shows that a future (a leader's term, say)
/// was dropped.
pub(crate) struct DropFlag(pub(crate) Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Whether the mock server holds `key` live.
pub(crate) fn live_on(server: &volcano_mock_server::MockServer, key: &str) -> bool {
    server.locks().iter().any(|l| l.key == key && l.live)
}
