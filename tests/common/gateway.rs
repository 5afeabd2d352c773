//! A small gateway in front of a server, as a test's network: a TCP
//! forwarder that passes each request on, or holds it on its way, or
//! answers it with a 5xx after its patience runs out while the request
//! goes on to the server and is applied later (what a load balancer or an
//! API gateway does when the service behind it is slow).
//!
//! One request per connection: every answer it sends says
//! `Connection: close`, and every request it forwards asks for the same,
//! so a response ends where its connection does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the gateway does with one request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Plan {
    /// Forward it at once and relay the answer.
    Pass,
    /// Hold it on its way for this long, then forward it and relay the
    /// answer (to a client that may have gone).
    Hold(Duration),
    /// Answer `status` after `patience`; forward the request after
    /// `apply_after` (from its arrival) whatever the client does, and
    /// drop the server's answer.
    GiveUp {
        status: u16,
        patience: Duration,
        apply_after: Duration,
        /// Answer with JSON of the gateway's own (Envoy's shape,
        /// `{"code":504,"message":".."}`) instead of an HTML page.
        json: bool,
    },
}

/// The head of a request the gateway saw: its method and path.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) path: String,
}

type Planner = dyn Fn(&Seen) -> Plan + Send + Sync;

/// A running gateway: its URL, and the requests it saw.
pub(crate) struct Gateway {
    pub(crate) url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Gateway {
    /// A gateway to `upstream` (`http://host:port`) that asks `plan` what
    /// to do with each request, in the order they arrive.
    pub(crate) async fn start(
        upstream: &str,
        plan: impl Fn(&Seen) -> Plan + Send + Sync + 'static,
    ) -> Gateway {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let plan: Arc<Planner> = Arc::new(plan);
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (upstream, plan, log) = (upstream.clone(), plan.clone(), log.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, &upstream, &*plan, &log).await;
                });
            }
        });
        Gateway { url, seen }
    }

    /// The requests seen so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    mut client: TcpStream,
    upstream: &str,
    plan: &Planner,
    log: &Mutex<Vec<Seen>>,
) -> std::io::Result<()> {
    let (seen, request) = read_request(&mut client).await?;
    let planned = {
        let mut log = log.lock().unwrap();
        log.push(seen.clone());
        plan(&seen)
    };
    match planned {
        Plan::Pass => relay(client, upstream, request).await,
        Plan::Hold(by) => {
            tokio::time::sleep(by).await;
            relay(client, upstream, request).await
        }
        Plan::GiveUp {
            status,
            patience,
            apply_after,
            json,
        } => {
            let upstream = upstream.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(apply_after).await;
                let _ = forward(&upstream, &request).await;
            });
            tokio::time::sleep(patience).await;
            let (kind, body) = if json {
                let body = format!(r#"{{"code":{status},"message":"upstream request timeout"}}"#);
                ("application/json", body)
            } else {
                let body = format!("<html><body><h1>{status} Gateway gave up</h1></body></html>");
                ("text/html", body)
            };
            let answer = format!(
                "HTTP/1.1 {status} Gateway gave up\r\ncontent-type: {kind}\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            client.write_all(answer.as_bytes()).await?;
            client.shutdown().await
        }
    }
}

/// Forwards `request` and copies the server's answer back to `client`.
async fn relay(mut client: TcpStream, upstream: &str, request: Vec<u8>) -> std::io::Result<()> {
    let answer = forward(upstream, &request).await?;
    client.write_all(&answer).await?;
    client.shutdown().await
}

/// Sends `request` to `upstream` and reads its whole answer.
async fn forward(upstream: &str, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(request).await?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer).await?;
    Ok(answer)
}

/// Reads one request: its head, rewritten to close the connection after
/// it, and its body (by `content-length`).
async fn read_request(stream: &mut TcpStream) -> std::io::Result<(Seen, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default().to_owned();
    let mut parts = first.split(' ');
    let seen = Seen {
        method: parts.next().unwrap_or_default().to_owned(),
        path: parts.next().unwrap_or_default().to_owned(),
    };
    let mut length = 0usize;
    let mut request = format!("{first}\r\n");
    for line in lines {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("connection:") {
            continue;
        }
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        request.push_str(line);
        request.push_str("\r\n");
    }
    request.push_str("connection: close\r\n\r\n");
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let mut request = request.into_bytes();
    request.extend_from_slice(&body);
    Ok((seen, request))
}
