//! The throughput benchmark's load generator: pre-built HTTP/1.1 requests
//! written as raw bytes over keep-alive connections, and answers read with
//! just enough parsing to find their end and check their status. It runs on
//! one thread (a current-thread runtime), so it can never take more than
//! one of the machine's cores, and per pair it does a small fraction of
//! what a server does. Whatever the server cannot keep up with shows.

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
            let cpu_before = crate::measure::thread_cpu_seconds();
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
                cpu: crate::measure::thread_cpu_seconds() - cpu_before,
            }
        })
    })
    .join()
    .unwrap()
}
