//! Load benchmarks (DESIGN section 7). Each prints a table and keeps it in
//! `target/benchmarks/`; `VOLCANO_BENCH_UPDATE_DOCS=1` also updates its
//! section of the tracked `docs/benchmarks.md`:
//!
//! ```sh
//! cargo bench -p volcano --bench load -- overhead     # SDK vs bare reqwest, same requests
//! cargo bench -p volcano --bench load -- throughput   # mock server vs a no-op handler, 64 connections
//! cargo bench -p volcano --bench load -- scale        # 10,000 with_lock guards for 30 s (+ 5 % 503s)
//! cargo bench -p volcano --bench load -- latency      # acquire latency, 1 and 64 clients
//! cargo bench -p volcano --bench load -- startup      # MockServer::start() and drop, 1 and 200 instances
//! cargo bench -p volcano --bench load                 # all five
//! cargo bench -p volcano --bench load -- instructions # callgrind: instructions per pair (valgrind)
//! ```
//!
//! The server runs in a child process (this binary again, `--serve`), so
//! the client's CPU and memory are measured alone. The throughput
//! benchmark's no-op baseline is a server of its own, in [`baseline`]: it
//! is not part of the mock server.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use volcano::{Client, Error};
use volcano_mock_server::MockServer;

const TOKEN: &str = "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(args.get(i + 1).map_or("mock", String::as_str));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--pairs") {
        let who = args.get(i + 1).cloned().unwrap_or_default();
        let count = args.get(i + 2).and_then(|v| v.parse().ok()).unwrap_or(1000);
        pairs_only(&who, count);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--scale-run") {
        let every = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0);
        let held_locks = args.get(i + 2).is_some_and(|v| v == "hold");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let hold = Duration::from_secs(30);
        let run = runtime.block_on(scale_run(scale_guards(), hold, every, held_locks));
        println!("{}", run.to_json());
        return;
    }
    let which = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .cloned()
        .unwrap_or_else(|| "all".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let run = |name: &str| which == "all" || which == name;
        if run("overhead") {
            overhead().await;
        }
        if run("throughput") {
            throughput().await;
        }
        if run("scale") {
            scale().await;
        }
        if run("latency") {
            latency().await;
        }
    });
    if which == "all" || which == "startup" {
        startup();
    }
    // Not part of "all": it needs valgrind and takes minutes.
    if which == "instructions" {
        instructions();
    }
}

// ------------------------------------------------------------ the server

/// Child-process mode: serve until standard input closes. `kind` is
/// `mock` (the mock lock server) or `baseline` (the no-op server).
fn serve(kind: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if kind == "baseline" {
            let server = baseline::start().await;
            // It checks no credential; the key is only there to be sent.
            announce(&format!("http://{}", server.addr), "baseline-key");
            stdin_closed().await;
            drop(server);
        } else {
            let server = MockServer::start().await;
            announce(server.url(), server.service_key());
            stdin_closed().await;
            drop(server);
        }
    });
}

/// The line `Server::start` reads: the URL and the key to use.
fn announce(url: &str, key: &str) {
    println!("{url} {key}");
    std::io::stdout().flush().unwrap();
}

async fn stdin_closed() {
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin()
            .read_line(&mut sink)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
    .await
    .unwrap();
}

/// The no-op baseline for the throughput benchmark: the mock server's
/// stack (hyper HTTP/1.1 over tokio, a task per keep-alive connection, an
/// axum `Router`) answering the five lock routes with canned bodies, and
/// nothing else: no auth, validation, state, faults or journal. What the
/// mock server does beyond this is what the throughput ratio measures; that
/// includes its own routing, its per-connection kill handle and a `Date`
/// formatted from its movable clock (the baseline keeps hyper's cached one).
mod baseline {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use axum::Router;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;
    use tower::ServiceExt;

    /// Acquire's and renew's answer.
    const LEASE: &str = r#"{"expires_at":"1970-01-01T00:00:00.000Z","fencing_token":1}"#;
    /// Get's answer.
    const NOT_HELD: &str = r#"{"held":false}"#;

    /// A running baseline server; dropping it stops accepting.
    pub(crate) struct Baseline {
        pub(crate) addr: SocketAddr,
        accept: JoinHandle<()>,
    }

    impl Drop for Baseline {
        fn drop(&mut self) {
            self.accept.abort();
        }
    }

    fn json(status: StatusCode, body: &'static str) -> impl IntoResponse {
        (status, [(header::CONTENT_TYPE, "application/json")], body)
    }

    fn router() -> Router {
        Router::new()
            .route(
                "/locks/{key}/lease",
                post(|| async { json(StatusCode::CREATED, LEASE) })
                    .patch(|| async { json(StatusCode::OK, LEASE) })
                    .delete(|| async { StatusCode::NO_CONTENT }),
            )
            .route(
                "/locks/{key}",
                get(|| async { json(StatusCode::OK, NOT_HELD) })
                    .delete(|| async { StatusCode::NO_CONTENT }),
            )
    }

    /// Listens on 127.0.0.1 and a free port, serving each connection with
    /// HTTP/1.1 as the mock server does.
    pub(crate) async fn start() -> Baseline {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router();
        let accept = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            app.clone().oneshot(req.map(Body::new))
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(10))
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Baseline { addr, accept }
    }
}

struct Server {
    child: Child,
    url: String,
    key: String,
}

impl Server {
    fn start(kind: &str) -> Server {
        Server::spawn(Command::new(std::env::current_exe().unwrap()).args(["--serve", kind]))
    }

    /// Starts a server process (`--serve`, perhaps under a wrapper such as
    /// valgrind) and reads the line it announces itself with.
    fn spawn(command: &mut Command) -> Server {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server process starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let (url, key) = line.trim().split_once(' ').expect("url and key");
        Server {
            url: url.to_owned(),
            key: key.to_owned(),
            child,
        }
    }

    /// The server's loopback address (it announces a plain `http://` URL).
    fn addr(&self) -> std::net::SocketAddr {
        self.url
            .trim_start_matches("http://")
            .parse()
            .expect("a loopback address")
    }

    fn client(&self) -> Client {
        Client::builder()
            .anon_key("bench")
            .service_key(&self.key)
            .api_url(&self.url)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    async fn control(&self, path: &str, body: &str) {
        let response = reqwest::Client::new()
            .post(format!("{}/__mock/{path}", self.url))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
    }

    async fn journal(&self) -> Vec<serde_json::Value> {
        let body = reqwest::Client::new()
            .get(format!("{}/__mock/requests", self.url))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(&format!("/proc/{}/stat", self.child.id()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------ helpers

fn cpu_seconds(stat_path: &str) -> f64 {
    let stat = std::fs::read_to_string(stat_path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15; after the ')' they are 11 and 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// Voluntary context switches of every thread of this process so far: how
/// often its threads went to sleep, i.e. were woken up.
fn wakeups() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Prints a section and keeps it in `target/benchmarks/<name>.md`. With
/// `VOLCANO_BENCH_UPDATE_DOCS=1` it also replaces that section of the
/// tracked docs/benchmarks.md (between its markers); otherwise a run
/// changes no tracked file.
fn report(name: &str, title: &str, body: &str) {
    let section = format!("<!-- bench:{name} -->\n## {title}\n\n{body}\n<!-- /bench:{name} -->");
    println!("\n{section}\n");
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/target/benchmarks");
    std::fs::create_dir_all(out).unwrap();
    std::fs::write(format!("{out}/{name}.md"), format!("{section}\n")).unwrap();
    if std::env::var_os("VOLCANO_BENCH_UPDATE_DOCS").is_none_or(|v| v != "1") {
        return;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md");
    let mut doc = std::fs::read_to_string(path).unwrap_or_default();
    if doc.is_empty() {
        doc = "# Benchmarks\n\nProduced by `cargo bench -p volcano --bench load` (release build). \
               Each section says when and where it was measured.\n"
            .to_owned();
    }
    let start = format!("<!-- bench:{name} -->");
    let end = format!("<!-- /bench:{name} -->");
    match (doc.find(&start), doc.find(&end)) {
        (Some(a), Some(b)) => doc.replace_range(a..b + end.len(), &section),
        _ => doc = format!("{}\n\n{section}\n", doc.trim_end()),
    }
    std::fs::write(path, doc).unwrap();
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "Measured {} on {cores} cores, {} build.",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    )
}

// ------------------------------------------------------------ 1. overhead

/// One acquire+release pair with a bare reqwest client: the same method,
/// path, headers and body as the SDK sends.
async fn raw_pair(http: &reqwest::Client, url: &str, auth: &str, request_id: &str) {
    let lease = format!("{url}/locks/overhead/lease");
    let acquired = http
        .post(&lease)
        .header("authorization", auth)
        .header("x-volcano-request-id", request_id)
        .header("x-volcano-lock-token", TOKEN)
        .header("accept", "application/json")
        .header("content-type", "application/json")
        .body(r#"{"ttl_seconds":30}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(acquired.status(), 201);
    let _ = acquired.bytes().await.unwrap();
    let released = http
        .delete(&lease)
        .header("authorization", auth)
        .header("x-volcano-request-id", request_id)
        .header("x-volcano-lock-token", TOKEN)
        .header("accept", "application/json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 204);
    let _ = released.bytes().await.unwrap();
}

async fn sdk_pair(locks: &volcano::Locks) {
    let lease = locks
        .acquire("overhead", Duration::from_secs(30))
        .token(TOKEN)
        .await
        .unwrap();
    locks.release(&lease).await.unwrap();
}

async fn overhead() {
    const ROUNDS: usize = 25;
    const PAIRS: usize = 300;
    let server = Server::start("mock");
    let locks = server.client().locks();
    let mut http = reqwest::Client::builder().user_agent("bench");
    if std::env::var_os("VOLCANO_BENCH_BARE_TIMEOUT").is_some() {
        http = http.timeout(Duration::from_secs(10));
    }
    let http = http.build().unwrap();
    let auth = format!("Bearer {}", server.key);
    let request_id = uuid::Uuid::new_v4().to_string();
    for _ in 0..200 {
        sdk_pair(&locks).await;
        raw_pair(&http, &server.url, &auth, &request_id).await;
    }
    let (mut sdk, mut raw, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        // Interleave pair by pair, alternating which goes first, so that
        // drift in the machine's state hits both alike.
        let mut time_sdk = Duration::ZERO;
        let mut time_raw = Duration::ZERO;
        for pair in 0..PAIRS {
            for turn in 0..2 {
                let started = Instant::now();
                if (pair + turn) % 2 == 0 {
                    sdk_pair(&locks).await;
                    time_sdk += started.elapsed();
                } else {
                    raw_pair(&http, &server.url, &auth, &request_id).await;
                    time_raw += started.elapsed();
                }
            }
        }
        sdk.push(time_sdk.as_secs_f64() / PAIRS as f64);
        raw.push(time_raw.as_secs_f64() / PAIRS as f64);
        ratios.push(time_sdk.as_secs_f64() / time_raw.as_secs_f64());
    }
    let (sdk, raw, ratio) = (median(&mut sdk), median(&mut raw), median(&mut ratios));
    let verdict = if ratio <= 1.03 { "met" } else { "NOT met" };
    report(
        "overhead",
        "1. SDK overhead",
        &format!(
            "{}\n\nAcquire + release pairs on one keep-alive connection each against the mock \
             server, {ROUNDS} rounds of {PAIRS} pairs, SDK and bare pairs interleaved one by one.\n\n\
             | client | median time per pair |\n|---|---|\n\
             | volcano SDK | {} |\n| bare reqwest, same requests | {} |\n\n\
             Median over rounds of the ratio SDK / bare: \
             **{ratio:.3}** (target ≤ 1.03: {verdict}).",
            machine(),
            micros(Duration::from_secs_f64(sdk)),
            micros(Duration::from_secs_f64(raw)),
        ),
    );
}

// ------------------------------------------------------------ 2. throughput

/// The throughput benchmark's load generator: pre-built HTTP/1.1 requests
/// written as raw bytes over keep-alive connections, and answers read with
/// just enough parsing to find their end and check their status. It runs on
/// one thread (a current-thread runtime), so it can never take more than
/// one of the machine's cores, and per pair it does a small fraction of
/// what a server does. Whatever the server cannot keep up with shows.
mod raw_load {
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// What one run did.
    pub(crate) struct Run {
        pub(crate) pairs: u64,
        pub(crate) seconds: f64,
        /// CPU seconds of the generator's thread over the run.
        pub(crate) cpu: f64,
    }

    /// The acquire and release of one key, byte for byte as sent.
    fn requests(host: &str, key: &str, auth: &str, request_id: &str, token: &str) -> [Vec<u8>; 2] {
        let body = r#"{"ttl_seconds":30}"#;
        let acquire = format!(
            "POST /locks/{key}/lease HTTP/1.1\r\nhost: {host}\r\nauthorization: {auth}\r\n\
             x-volcano-request-id: {request_id}\r\nx-volcano-lock-token: {token}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let release = format!(
            "DELETE /locks/{key}/lease HTTP/1.1\r\nhost: {host}\r\nauthorization: {auth}\r\n\
             x-volcano-request-id: {request_id}\r\nx-volcano-lock-token: {token}\r\n\r\n"
        );
        [acquire.into_bytes(), release.into_bytes()]
    }

    /// Reads one answer into `buf` (keeping any bytes past it for the next)
    /// and checks its status.
    async fn answer(stream: &mut TcpStream, buf: &mut Vec<u8>, status: &[u8; 3]) {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = find(buf, b"\r\n\r\n") {
                let head = &buf[..end];
                assert!(
                    head.len() > 12 && &head[9..12] == status,
                    "expected {}, got {}",
                    String::from_utf8_lossy(status),
                    String::from_utf8_lossy(&head[..head.len().min(64)])
                );
                let length = content_length(head);
                let total = end + 4 + length;
                while buf.len() < total {
                    let n = stream.read(&mut chunk).await.expect("read");
                    assert!(n > 0, "the server closed the connection");
                    buf.extend_from_slice(&chunk[..n]);
                }
                buf.drain(..total);
                return;
            }
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "the server closed the connection");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        haystack.windows(needle.len()).position(|w| w == needle)
    }

    fn content_length(head: &[u8]) -> usize {
        head.split(|&b| b == b'\n')
            .find_map(|line| {
                let line = std::str::from_utf8(line).ok()?;
                let (name, value) = line.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0)
    }

    /// One keep-alive connection with its key's two requests.
    struct Connection {
        stream: TcpStream,
        buf: Vec<u8>,
        acquire: Vec<u8>,
        release: Vec<u8>,
    }

    impl Connection {
        async fn open(addr: SocketAddr, key: &str, auth: &str, token: &str) -> Connection {
            let stream = TcpStream::connect(addr).await.expect("connect");
            stream.set_nodelay(true).unwrap();
            let request_id = uuid::Uuid::new_v4().to_string();
            let [acquire, release] = requests(&addr.to_string(), key, auth, &request_id, token);
            Connection {
                stream,
                buf: Vec::with_capacity(8192),
                acquire,
                release,
            }
        }

        /// One acquire + release, each answer checked.
        async fn pair(&mut self) {
            self.stream.write_all(&self.acquire).await.expect("write");
            answer(&mut self.stream, &mut self.buf, b"201").await;
            self.stream.write_all(&self.release).await.expect("write");
            answer(&mut self.stream, &mut self.buf, b"204").await;
        }
    }

    /// Exactly `pairs` acquire + release pairs, spread over `connections`
    /// keep-alive connections, from one thread.
    pub(crate) fn run_pairs(
        addr: SocketAddr,
        auth: &str,
        token: &str,
        connections: usize,
        pairs: usize,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..connections {
                let key = format!("instructions-{i}");
                let mut connection = Connection::open(addr, &key, auth, token).await;
                let share = pairs / connections + usize::from(i < pairs % connections);
                tasks.push(tokio::spawn(async move {
                    for _ in 0..share {
                        connection.pair().await;
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
        });
    }

    /// Acquire + release pairs on `connections` keep-alive connections (one
    /// key each) for `seconds`, from one thread.
    pub(crate) fn run(
        addr: SocketAddr,
        auth: &str,
        token: &str,
        connections: usize,
        seconds: f64,
    ) -> Run {
        let auth = auth.to_owned();
        let token = token.to_owned();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut opened = Vec::new();
                for i in 0..connections {
                    let key = format!("throughput-{i}");
                    opened.push(Connection::open(addr, &key, &auth, &token).await);
                }
                let cpu_before = super::thread_cpu_seconds();
                let started = Instant::now();
                let until = started + Duration::from_secs_f64(seconds);
                let tasks: Vec<_> = opened
                    .into_iter()
                    .map(|mut connection| {
                        tokio::spawn(async move {
                            let mut pairs = 0u64;
                            while Instant::now() < until {
                                connection.pair().await;
                                pairs += 1;
                            }
                            pairs
                        })
                    })
                    .collect();
                let mut pairs = 0;
                for task in tasks {
                    pairs += task.await.unwrap();
                }
                Run {
                    pairs,
                    seconds: started.elapsed().as_secs_f64(),
                    cpu: super::thread_cpu_seconds() - cpu_before,
                }
            })
        })
        .join()
        .unwrap()
    }
}

/// CPU seconds the calling thread has used.
fn thread_cpu_seconds() -> f64 {
    // Linux: /proc/thread-self/stat has the thread's utime and stime.
    cpu_seconds("/proc/thread-self/stat")
}

/// One round on one server: pairs per second, and the share of a core each
/// process used.
struct Round {
    pairs_per_sec: f64,
    generator_cores: f64,
    server_cores: f64,
}

fn round(server: &Server, connections: usize, seconds: f64) -> Round {
    let addr = server.addr();
    let server_before = server.cpu_seconds();
    let run = raw_load::run(
        addr,
        &format!("Bearer {}", server.key),
        TOKEN,
        connections,
        seconds,
    );
    let server_cpu = server.cpu_seconds() - server_before;
    Round {
        pairs_per_sec: run.pairs as f64 / run.seconds,
        generator_cores: run.cpu / run.seconds,
        server_cores: server_cpu / run.seconds,
    }
}

async fn throughput() {
    const CONNECTIONS: usize = 64;
    const SECONDS: f64 = 6.0;
    const ROUNDS: usize = 5;
    let mock = Server::start("mock");
    let baseline = Server::start("baseline");
    // Warm both up (connections, allocator, the mock's maps).
    round(&mock, CONNECTIONS, 1.0);
    round(&baseline, CONNECTIONS, 1.0);
    let (mut on_mock, mut on_baseline, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = String::new();
    for i in 0..ROUNDS {
        // Alternate which goes first, so drift hits both alike.
        let (m, b) = if i % 2 == 0 {
            let m = round(&mock, CONNECTIONS, SECONDS);
            (m, round(&baseline, CONNECTIONS, SECONDS))
        } else {
            let b = round(&baseline, CONNECTIONS, SECONDS);
            (round(&mock, CONNECTIONS, SECONDS), b)
        };
        // A fresh journal and store each round, as a test suite would have.
        mock.control("reset", "").await;
        rows.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |\n",
            i + 1,
            m.pairs_per_sec,
            m.server_cores,
            m.generator_cores,
            b.pairs_per_sec,
            b.server_cores,
            b.generator_cores,
            m.pairs_per_sec / b.pairs_per_sec
        ));
        ratios.push(m.pairs_per_sec / b.pairs_per_sec);
        on_mock.push(m);
        on_baseline.push(b);
    }
    let per_sec =
        |rounds: &[Round]| median(&mut rounds.iter().map(|r| r.pairs_per_sec).collect::<Vec<_>>());
    let (m, b) = (per_sec(&on_mock), per_sec(&on_baseline));
    let ratio = median(&mut ratios);
    let generator_max = on_mock
        .iter()
        .chain(&on_baseline)
        .map(|r| r.generator_cores)
        .fold(0.0, f64::max);
    let verdict = if ratio >= 0.8 { "met" } else { "NOT met" };
    let bound = if generator_max < 0.9 {
        format!(
            "The generator's one thread never used more than {generator_max:.2} of a core, so it \
             was never the bottleneck: each server was, on the core and a bit the generator left it."
        )
    } else {
        format!(
            "The generator's thread used up to {generator_max:.2} of a core: it may have bounded \
             some rounds, and the ratio may understate the difference."
        )
    };
    report(
        "throughput",
        "2. Mock server throughput",
        &format!(
            "{}\n\nAcquire + release pairs per second from {CONNECTIONS} keep-alive connections \
             (one key each), {ROUNDS} interleaved rounds of {SECONDS} s per server. The load \
             generator writes pre-built requests and reads answers with minimal parsing, on one \
             thread of its own process; the server runs in another (2 worker threads). Cores: the \
             CPU time each process used over the round, per second.\n\n\
             | round | mock pairs/s | mock server cores | generator cores | no-op pairs/s | no-op server cores | generator cores | ratio |\n\
             |---|---|---|---|---|---|---|---|\n{rows}\n\
             Median: mock **{m:.0}** pairs/s, no-op handler on the same stack {b:.0}; median \
             ratio **{ratio:.2}** (target ≥ 0.8: {verdict}). {bound}",
            machine()
        ),
    );
}

// ------------------------------------------------------------ 3. scale

#[derive(serde::Serialize, serde::Deserialize)]
struct ScaleRun {
    guards: usize,
    renewals: usize,
    renewal_503s: usize,
    losses: usize,
    other_errors: usize,
    rss_per_guard_kib: f64,
    client_cpu: f64,
    server_cpu: f64,
    acquire_secs: f64,
    /// Client CPU of a bare reqwest client sending as many identical
    /// renewal PATCHes (64 at a time) right after the window; hold runs only.
    bare_cpu: f64,
    /// Thread wake-ups a second (voluntary context switches of every
    /// client thread) over the window.
    wakeups_per_sec: f64,
    /// A bare reqwest renewal loop per lock on the same schedule, for as
    /// long as the window; hold clean runs only.
    paced: Option<PacedRun>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct PacedRun {
    requests: usize,
    cpu: f64,
    wakeups_per_sec: f64,
}

impl ScaleRun {
    fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap()
    }
}

fn scale_guards() -> usize {
    std::env::var("VOLCANO_BENCH_GUARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Runs one scale scenario in a fresh process, so that its memory figure
/// does not include what an earlier run freed.
fn scale_in_child(every: u32, held_locks: bool) -> ScaleRun {
    let kind = if held_locks { "hold" } else { "with_lock" };
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--scale-run", &every.to_string(), kind])
        .stderr(Stdio::inherit())
        .output()
        .expect("the scale run starts");
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default()).expect("scale figures")
}

/// `guards` locks on distinct keys, each a `with_lock` task whose closure
/// sleeps, or (`held_locks`) a `HeldLock` kept in a list with no task of
/// its own but its renewal.
async fn scale_run(
    guards: usize,
    hold: Duration,
    every: Option<u32>,
    held_locks: bool,
) -> ScaleRun {
    let server = Server::start("mock");
    if let Some(n) = every {
        server
            .control(
                "faults",
                &format!(r#"{{"kind":"status","status":503,"operation":"renew","every":{n}}}"#),
            )
            .await;
    }
    let client = server.client();
    let locks = client.locks();
    let rss_before = rss_kib();
    let started = Instant::now();
    let held = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let until = tokio::time::Instant::now() + hold + Duration::from_secs(10);
    let kept = Arc::new(std::sync::Mutex::new(Vec::with_capacity(guards)));
    let mut tasks = Vec::with_capacity(guards);
    for i in 0..guards {
        let (locks, held, gate) = (locks.clone(), held.clone(), gate.clone());
        if held_locks {
            let kept = kept.clone();
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                let lock = locks
                    .hold(format!("scale-{i}"), Duration::from_secs(15))
                    .await?;
                kept.lock().unwrap().push(lock);
                held.fetch_add(1, Ordering::Relaxed);
                Ok::<_, Error>(())
            }));
            continue;
        }
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await.unwrap();
            locks
                .with_lock(
                    format!("scale-{i}"),
                    Duration::from_secs(15),
                    |_guard| async move {
                        drop(permit);
                        held.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep_until(until).await;
                        Ok::<_, Error>(())
                    },
                )
                .await
        }));
    }
    while held.load(Ordering::Relaxed) < guards && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let acquire_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_held = rss_kib();
    // Count from here: every guard is held and renewing.
    let seq = |r: &serde_json::Value| r["seq"].as_u64().unwrap_or(0);
    let window_start = server.journal().await.last().map_or(0, seq);
    let cpu_start = cpu_seconds("/proc/self/stat");
    let server_cpu_start = server.cpu_seconds();
    let wakeups_start = wakeups();
    tokio::time::sleep(hold).await;
    let client_cpu = cpu_seconds("/proc/self/stat") - cpu_start;
    let server_cpu = server.cpu_seconds() - server_cpu_start;
    let wakeups_per_sec = (wakeups() - wakeups_start) as f64 / hold.as_secs_f64();
    let journal = server.journal().await;
    let renew = |status: u64| {
        journal
            .iter()
            .filter(|r| seq(r) > window_start && r["operation"] == "renew" && r["status"] == status)
            .count()
    };
    let (renewals, renewal_503s) = (renew(200), renew(503));
    let (mut losses, mut other_errors) = (0, 0);
    let mut count = |result: Result<(), Error>| match result {
        Ok(()) => {}
        Err(Error::LockLost(_)) => losses += 1,
        Err(_) => other_errors += 1,
    };
    for task in tasks {
        count(task.await.unwrap());
    }
    let kept = std::mem::take(&mut *kept.lock().unwrap());
    let bare_cpu = match kept.first() {
        // Clean runs only: the injected 503s would answer these too.
        Some(lock) if held_locks && every.is_none() => {
            bare_renewals(&server, &lock.lease(), renewals).await
        }
        _ => 0.0,
    };
    for lock in kept {
        count(lock.release().await);
    }
    let paced = if held_locks && every.is_none() {
        Some(paced_renewals(&server, &client, guards, hold).await)
    } else {
        None
    };
    ScaleRun {
        guards,
        renewals,
        renewal_503s,
        losses,
        other_errors,
        rss_per_guard_kib: rss_held.saturating_sub(rss_before) as f64 / guards as f64,
        client_cpu,
        server_cpu,
        acquire_secs,
        bare_cpu,
        wakeups_per_sec,
        paced,
    }
}

/// The client CPU seconds a bare `reqwest::Client` spends sending `count`
/// renewals of `lease` (the SDK's method, path, headers and body), 64 in
/// flight at a time.
async fn bare_renewals(server: &Server, lease: &volcano::LockLease, count: usize) -> f64 {
    let http = reqwest::Client::new();
    let url = format!("{}/locks/{}/lease", server.url, lease.key());
    let auth = format!("Bearer {}", server.key);
    let token = lease.token().to_owned();
    let next = Arc::new(AtomicUsize::new(0));
    let cpu_start = cpu_seconds("/proc/self/stat");
    let mut senders = Vec::new();
    for _ in 0..64 {
        let (http, url, auth, token, next) = (
            http.clone(),
            url.clone(),
            auth.clone(),
            token.clone(),
            next.clone(),
        );
        senders.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < count {
                let renewed = http
                    .patch(&url)
                    .header("authorization", &auth)
                    .header("x-volcano-request-id", uuid::Uuid::new_v4().to_string())
                    .header("x-volcano-lock-token", &token)
                    .header("accept", "application/json")
                    .header("content-type", "application/json")
                    .body(r#"{"ttl_seconds":15}"#)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(renewed.status(), 200);
                let _ = renewed.bytes().await.unwrap();
            }
        }));
    }
    for sender in senders {
        sender.await.unwrap();
    }
    cpu_seconds("/proc/self/stat") - cpu_start
}

/// What a hand-written renewal loop costs: `locks` fresh locks, each
/// renewed by its own task with a bare `reqwest::Client` on the guard's
/// schedule (every ttl/3 ± 10 %, first one ttl/3 after it was acquired),
/// measured over `window` after every loop has started.
async fn paced_renewals(
    server: &Server,
    client: &Client,
    locks: usize,
    window: Duration,
) -> PacedRun {
    const TTL: Duration = Duration::from_secs(15);
    let http = reqwest::Client::new();
    let auth: Arc<str> = format!("Bearer {}", server.key).into();
    let sent = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = Vec::with_capacity(locks);
    for i in 0..locks {
        let (sdk, http, auth, sent, gate) = (
            client.locks(),
            http.clone(),
            auth.clone(),
            sent.clone(),
            gate.clone(),
        );
        let url = format!("{}/locks/paced-{i}/lease", server.url);
        tasks.push(tokio::spawn(async move {
            let lease = {
                let _permit = gate.acquire().await.unwrap();
                sdk.acquire(format!("paced-{i}"), TTL).await.unwrap()
            };
            let token = lease.token().to_owned();
            loop {
                tokio::time::sleep((TTL / 3).mul_f64(0.9 + 0.2 * rand::random::<f64>())).await;
                let renewed = http
                    .patch(&url)
                    .header("authorization", &*auth)
                    .header("x-volcano-request-id", uuid::Uuid::new_v4().to_string())
                    .header("x-volcano-lock-token", &token)
                    .header("accept", "application/json")
                    .header("content-type", "application/json")
                    .body(r#"{"ttl_seconds":15}"#)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(renewed.status(), 200);
                let _ = renewed.bytes().await.unwrap();
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // As for the guards: start counting once every loop runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (cpu_start, wakeups_start) = (cpu_seconds("/proc/self/stat"), wakeups());
    let sent_start = sent.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let run = PacedRun {
        requests: sent.load(Ordering::Relaxed) - sent_start,
        cpu: cpu_seconds("/proc/self/stat") - cpu_start,
        wakeups_per_sec: (wakeups() - wakeups_start) as f64 / window.as_secs_f64(),
    };
    for task in tasks {
        task.abort();
    }
    run
}

async fn scale() {
    let hold = Duration::from_secs(30);
    let run =
        |every, held_locks| tokio::task::spawn_blocking(move || scale_in_child(every, held_locks));
    let clean = run(0, false).await.unwrap();
    let faulty = run(20, false).await.unwrap();
    let held_clean = run(0, true).await.unwrap();
    let held_faulty = run(20, true).await.unwrap();
    // CPU figures vary from run to run on a shared machine: two more clean
    // runs, and the median ratio.
    let mut cpu_runs = vec![held_clean];
    for _ in 0..2 {
        cpu_runs.push(run(0, true).await.unwrap());
    }
    let row = |name: &str, r: &ScaleRun| {
        format!(
            "| {name} | {} | {:.1} s | {} | {} | {} | {} | {:.1} KiB | {:.1} s | {:.1} s |",
            r.guards,
            r.acquire_secs,
            r.renewals,
            r.renewal_503s,
            r.losses,
            r.other_errors,
            r.rss_per_guard_kib,
            r.client_cpu,
            r.server_cpu
        )
    };
    let mut cpu_rows = Vec::new();
    let mut ratios = Vec::new();
    for (i, r) in cpu_runs.iter().enumerate() {
        let per_renewal = r.client_cpu / r.renewals.max(1) as f64;
        let paced = r
            .paced
            .as_ref()
            .expect("a clean hold run measures a bare loop");
        let paced_per_request = paced.cpu / paced.requests.max(1) as f64;
        let burst_per_request = r.bare_cpu / r.renewals.max(1) as f64;
        ratios.push(per_renewal / paced_per_request);
        cpu_rows.push(format!(
            "| {} | {} | {:.0} µs, {:.0} wake-ups/s | {} | {:.0} µs, {:.0} wake-ups/s | **{:.2}** | {:.0} µs | {:.2} |",
            i + 1,
            r.renewals,
            per_renewal * 1e6,
            r.wakeups_per_sec,
            paced.requests,
            paced_per_request * 1e6,
            paced.wakeups_per_sec,
            per_renewal / paced_per_request,
            burst_per_request * 1e6,
            per_renewal / burst_per_request,
        ));
    }
    let held_clean = &cpu_runs[0];
    let renewals_per_sec = held_clean.renewals as f64 / hold.as_secs_f64();
    report(
        "scale",
        "3. Scale: 10,000 guards on one client",
        &format!(
            "{}\n\nLocks on distinct keys (ttl 15 s) on one `Client`, held for {} s after \
             all were acquired; renewals and CPU are counted over that window. Memory is \
             the client's RSS growth per held lock. `with_lock`: a task per lock whose \
             closure sleeps; `hold`: a `HeldLock` kept in a list (its renewal is its only \
             task).\n\n\
             | run | locks | time to acquire all | renewals | renewal 503s | losses | other errors | RSS per lock | client CPU | server CPU |\n\
             |---|---|---|---|---|---|---|---|---|---|\n{}\n{}\n{}\n{}\n\n\
             Target: 0 losses in every run; at most 4 KiB per held lock.\n\n\
             **CPU per renewal and wake-ups**: `hold` clean, three runs, each beside a \
             bare `reqwest::Client` in the same process right after its window. \
             *Paced*: a loop per lock sending the identical PATCH on the guard's schedule; \
             *back to back*: as many PATCHes, 64 in flight.\n\n\
             | run | renewals | SDK per renewal | paced requests | paced bare per request | ratio | back-to-back bare per request | ratio |\n\
             |---|---|---|---|---|---|---|---|\n{}\n\n\
             Median ratio to the paced loop: **{:.2}** (target ≤ 1.3). A held lock's task \
             sleeps until its next renewal (every ttl/3 ± 10 %): {:.0} renewals a second \
             here, one timer wake-up each, nothing in between. A suspend is noticed by one \
             detector thread per process that looks once a second, not by the locks. \
             Wake-ups are the voluntary context switches of all client threads (the runtime's \
             workers park between bursts of work). The back-to-back figure is what the same \
             requests cost when no worker ever goes idle: the gap to it is the price of the \
             schedule, which a hand-written loop pays too.",
            machine(),
            hold.as_secs(),
            row("with_lock, clean", &clean),
            row("with_lock, 5 % of renewals answered 503", &faulty),
            row("hold, clean", held_clean),
            row("hold, 5 % of renewals answered 503", &held_faulty),
            cpu_rows.join("\n"),
            median(&mut ratios),
            renewals_per_sec,
        ),
    );
}

// ------------------------------------------------------------ 4. latency

async fn latency_samples(server: &Server, clients: usize, per_client: usize) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let locks = server.client().locks();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                let started = Instant::now();
                let lease = locks
                    .acquire(format!("latency-{c}"), Duration::from_secs(30))
                    .await
                    .unwrap();
                samples.push(started.elapsed());
                locks.release(&lease).await.unwrap();
            }
            samples
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    all
}

async fn latency() {
    let server = Server::start("mock");
    latency_samples(&server, 4, 100).await;
    let mut rows = Vec::new();
    for (clients, per_client) in [(1, 3_000), (64, 100)] {
        let samples = latency_samples(&server, clients, per_client).await;
        server.control("reset", "").await;
        rows.push(format!(
            "| {clients} | {} | {} | {} | {} | {} |",
            samples.len(),
            micros(percentile(&samples, 0.50)),
            micros(percentile(&samples, 0.90)),
            micros(percentile(&samples, 0.99)),
            micros(*samples.last().unwrap()),
        ));
    }
    report(
        "latency",
        "4. Acquire latency on loopback",
        &format!(
            "{}\n\nSDK `acquire` against the mock server (release untimed), each client \
             with its own `Client` and key.\n\n\
             | concurrent clients | samples | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n{}",
            machine(),
            rows.join("\n")
        ),
    );
}

// ------------------------------------------------------------ 5. startup

/// Until a connection to `addr` is refused: the server has let go of its
/// port. Returns how long that took.
fn until_refused(addr: std::net::SocketAddr) -> Duration {
    let started = Instant::now();
    // Not flat out: each connection that gets through is one more for the
    // server to serve while it shuts down.
    while std::net::TcpStream::connect(addr).is_ok() {
        std::thread::sleep(Duration::from_micros(20));
    }
    started.elapsed()
}

/// What a test suite pays for the mock server: one `MockServer::start()`
/// and drop at a time, and 200 alive at once, both on one runtime and as
/// 200 tests would have them (a thread and a current-thread runtime each,
/// as `#[tokio::test]` makes).
fn startup() {
    const ONE_AT_A_TIME: usize = 1_000;
    const MANY: usize = 200;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // Warm-up: the first start loads what every later one shares.
    runtime.block_on(async {
        drop(MockServer::start().await);
    });

    let (mut starts, mut stops) = (Vec::new(), Vec::new());
    for _ in 0..ONE_AT_A_TIME {
        let started = Instant::now();
        let server = runtime.block_on(MockServer::start());
        starts.push(started.elapsed());
        let addr = server.addr();
        let stopped = Instant::now();
        drop(server);
        let _ = until_refused(addr);
        stops.push(stopped.elapsed());
    }
    starts.sort();
    stops.sort();

    // 200 on one runtime.
    let rss_before = rss_kib();
    let started = Instant::now();
    let servers: Vec<MockServer> = runtime.block_on(async {
        let mut servers = Vec::with_capacity(MANY);
        for _ in 0..MANY {
            servers.push(MockServer::start().await);
        }
        servers
    });
    let start_many = started.elapsed();
    let per_server_kib = rss_kib().saturating_sub(rss_before) as f64 / MANY as f64;
    let addrs: Vec<std::net::SocketAddr> = servers.iter().map(MockServer::addr).collect();
    let stopped = Instant::now();
    drop(servers);
    for addr in addrs {
        until_refused(addr);
    }
    let stop_many = stopped.elapsed();

    // 200 as 200 tests: a thread and a current-thread runtime each.
    let rss_before = rss_kib();
    let barrier = Arc::new(std::sync::Barrier::new(MANY + 1));
    let done = Arc::new(std::sync::Barrier::new(MANY + 1));
    let started = Instant::now();
    let tests: Vec<_> = (0..MANY)
        .map(|_| {
            let (barrier, done) = (barrier.clone(), done.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let server = runtime.block_on(MockServer::start());
                barrier.wait();
                done.wait();
                drop(server);
                drop(runtime);
            })
        })
        .collect();
    barrier.wait();
    let start_tests = started.elapsed();
    let per_test_kib = rss_kib().saturating_sub(rss_before) as f64 / MANY as f64;
    done.wait();
    for test in tests {
        test.join().unwrap();
    }

    let micros_f = |d: Duration| format!("{:.0} µs", d.as_secs_f64() * 1e6);
    let start_p50 = percentile(&starts, 0.5);
    let start_goal = if start_p50 < Duration::from_millis(1) {
        "met"
    } else {
        "NOT met"
    };
    let memory_goal = if per_server_kib < 200.0 {
        "met"
    } else {
        "NOT met"
    };
    // Test suites run debug builds: `cargo bench -p volcano --profile dev --bench
    // load -- startup` measures that too, in a section of its own.
    let (name, title) = if cfg!(debug_assertions) {
        (
            "startup-debug",
            "9b. What the mock server costs a test suite, debug build",
        )
    } else {
        ("startup", "9. What the mock server costs a test suite")
    };
    report(
        name,
        title,
        &format!(
            "{}\n\nIn-process `MockServer::start()` (bind a loopback port, spawn the accept \
             loop and the expiry sweep) and drop (until the port refuses connections).\n\n\
             | case | start | drop | memory (RSS growth) |\n|---|---|---|---|\n\
             | one at a time, {ONE_AT_A_TIME} times (p50 / p99) | {} / {} | {} / {} | |\n\
             | {MANY} alive at once on one runtime (per server) | {} | {} | {per_server_kib:.0} KiB |\n\
             | {MANY} as {MANY} tests: a thread and a current-thread runtime each (per test) | {} | | {per_test_kib:.0} KiB |\n\n\
             Goals: start under 1 ms ({start_goal}), under 200 KiB per server ({memory_goal}). \
             The per-test row includes what the test harness's thread and runtime cost, not \
             only the server's.",
            machine(),
            micros_f(start_p50),
            micros_f(percentile(&starts, 0.99)),
            micros_f(percentile(&stops, 0.5)),
            micros_f(percentile(&stops, 0.99)),
            micros_f(start_many / MANY as u32),
            micros_f(stop_many / MANY as u32),
            micros_f(start_tests / MANY as u32),
        ),
    );
}

// ------------------------------------------------------------ instructions

/// Child-process mode for [`instructions`]: `count` acquire + release
/// pairs, SDK (`sdk`) or bare reqwest (`bare`), on a current-thread runtime
/// against a mock server in a child process of its own, after 50 of each
/// to warm up.
fn pairs_only(who: &str, count: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = Server::start("mock");
        let locks = server.client().locks();
        let http = reqwest::Client::builder()
            .user_agent("bench")
            .build()
            .unwrap();
        let auth = format!("Bearer {}", server.key);
        let request_id = uuid::Uuid::new_v4().to_string();
        for _ in 0..50 {
            sdk_pair(&locks).await;
            raw_pair(&http, &server.url, &auth, &request_id).await;
        }
        for _ in 0..count {
            if who == "sdk" {
                sdk_pair(&locks).await;
            } else {
                raw_pair(&http, &server.url, &auth, &request_id).await;
            }
        }
    });
}

/// Where callgrind writes the counts of the run named `label`.
fn callgrind_out(label: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/benchmarks");
    std::fs::create_dir_all(dir).unwrap();
    format!("{dir}/callgrind-{label}.out")
}

/// valgrind's callgrind, counting into [`callgrind_out`]`(label)`; only the
/// process it starts is counted (children run natively).
fn valgrind(label: &str) -> Command {
    let mut command = Command::new("valgrind");
    command.args([
        "--tool=callgrind",
        "-q",
        &format!("--callgrind-out-file={}", callgrind_out(label)),
    ]);
    command
}

/// The instructions the finished run named `label` executed.
fn callgrind_total(label: &str) -> u64 {
    let path = callgrind_out(label);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no total in {path}"))
}

/// Instructions per acquire + release pair, counted by callgrind (which
/// counts the same whatever else the machine does): on the client, SDK
/// against bare reqwest; on the server, the mock against the no-op
/// baseline, driven by the raw generator. Each is run at two lengths and
/// the difference divided, so start-up and warm-up cancel out.
fn instructions() {
    const SHORT: usize = 1_000;
    const LONG: usize = 3_000;
    let exe = std::env::current_exe().unwrap();
    let per_pair = |label: &str, run: &dyn Fn(&str, usize) -> u64| {
        let short = run(&format!("{label}-{SHORT}"), SHORT);
        let long = run(&format!("{label}-{LONG}"), LONG);
        long.saturating_sub(short) as f64 / (LONG - SHORT) as f64
    };
    let client = |who: &'static str| {
        let exe = exe.clone();
        move |label: &str, count: usize| {
            let status = valgrind(label)
                .arg(&exe)
                .args(["--pairs", who, &count.to_string()])
                .stdout(Stdio::null())
                .status()
                .expect("valgrind runs (apt install valgrind)");
            assert!(status.success(), "{label}: {status}");
            callgrind_total(label)
        }
    };
    let sdk = per_pair("client-sdk", &client("sdk"));
    let bare = per_pair("client-bare", &client("bare"));
    let server = |kind: &'static str| {
        let exe = exe.clone();
        move |label: &str, count: usize| {
            let mut command = valgrind(label);
            command.arg(&exe).args(["--serve", kind]);
            let server = Server::spawn(&mut command);
            raw_load::run_pairs(
                server.addr(),
                &format!("Bearer {}", server.key),
                TOKEN,
                8,
                count,
            );
            // Closing its standard input ends it; callgrind writes on exit.
            drop(server);
            callgrind_total(label)
        }
    };
    let mock = per_pair("server-mock", &server("mock"));
    let noop = per_pair("server-baseline", &server("baseline"));
    report(
        "instructions",
        "1b. Instructions per pair (callgrind)",
        &format!(
            "{}\n\n`cargo bench -p volcano --bench load -- instructions`: `valgrind --tool=callgrind` on one \
             process at a time, {SHORT} and {LONG} acquire + release pairs after a warm-up, the \
             difference divided by {}. The client runs on a current-thread runtime; the server \
             is driven by the raw load generator over 8 connections.\n\n\
             | process | instructions per pair | ratio |\n|---|---|---|\n\
             | client: volcano SDK | {:.1}k | {:.3} |\n\
             | client: bare reqwest, same requests | {:.1}k | 1 |\n\
             | server: mock lock server | {:.1}k | {:.2} |\n\
             | server: no-op handler, same stack | {:.1}k | 1 |",
            machine(),
            LONG - SHORT,
            sdk / 1e3,
            sdk / bare,
            bare / 1e3,
            mock / 1e3,
            mock / noop,
            noop / 1e3,
        ),
    );
}
