//! A leader as a Kubernetes deployment runs it: three replicas of one
//! program, each campaigning for the `scheduler` key, each serving HTTP
//! probes, each stepping down on SIGTERM after finishing the job in hand.
//!
//! - `GET /readyz`: 200 while this replica is a healthy candidate (leading,
//!   stepping down or following; the service unreachable for under 30 s),
//!   503 otherwise. Not "do I lead?": a rolling update waits for new pods
//!   to become ready, and new pods start as followers.
//! - `GET /livez`: 503 once the running term has outlived its lock by more
//!   than 5 s (a term stuck in blocking code: restart the process).
//! - `GET /leader`: 200 only while this replica leads and takes new work,
//!   for routing leader-only traffic (not a readiness probe).
//!
//! ```sh
//! cargo run --example leader_probe    # three replicas on the in-process mock server
//! ```
//!
//! With `VOLCANO_API_URL` or `VOLCANO_SERVICE_KEY` set, it is one replica
//! against that service, its probes on `PROBE_ADDR` (default
//! `127.0.0.1:8080`), until SIGTERM or Ctrl-C. Keep the drain (10 s here),
//! the 2 s `run` may take after it and the shutdown's timeout (5 s here)
//! under the pod's `terminationGracePeriodSeconds` (30 s by default): the
//! budget in the leader guide.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use volcano::mock::MockServer;
use volcano::{Client, LeaderHealth, LeaderStatus, LockGuard};

const KEY: &str = "scheduler";
const TTL: Duration = Duration::from_secs(15);
const DRAIN: Duration = Duration::from_secs(10);
/// How often a follower tries for the key: the default (a takeover after a
/// graceful step-down within 10 s; 6 tries a minute per follower against
/// the project's quota of 600).
const POLL: Duration = Duration::from_secs(10);
/// The demo's followers try every second, for a takeover you can watch
/// (60 tries a minute each: for a demo on the mock server, not for a fleet).
const DEMO_POLL: Duration = Duration::from_secs(1);

/// Readiness: a healthy candidate, leading or not.
fn ready(status: &LeaderStatus) -> bool {
    match *status {
        LeaderStatus::Leading { .. } | LeaderStatus::SteppingDown { .. } => true,
        LeaderStatus::Following => true,
        LeaderStatus::Unreachable { since } => since.elapsed() < Duration::from_secs(30),
        LeaderStatus::Stopped => false,
        _ => false, // a status added in a later version
    }
}

/// Liveness: the running term has not outlived its lock by more than 5 s.
fn alive(health: &LeaderHealth) -> bool {
    health
        .overdue()
        .is_none_or(|late| late <= Duration::from_secs(5))
}

/// Leader-only routing: leading, and not on the way out.
fn takes_leader_work(status: &LeaderStatus) -> bool {
    matches!(status, LeaderStatus::Leading { .. })
}

/// A minimal HTTP/1.1 responder for the three probes (your service has a
/// web framework for this; the example keeps to tokio).
async fn serve_probes(
    listener: TcpListener,
    status: watch::Receiver<LeaderStatus>,
    health: LeaderHealth,
) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let (status, health) = (status.clone(), health.clone());
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let Ok(n) = conn.read(&mut request).await else {
                return;
            };
            let line = String::from_utf8_lossy(&request[..n]);
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let now = *status.borrow();
            let ok = match path {
                "/readyz" => ready(&now),
                "/livez" => alive(&health),
                "/leader" => takes_leader_work(&now),
                _ => false,
            };
            let (code, body) = if ok {
                ("200 OK", "ok\n")
            } else {
                ("503 Service Unavailable", "no\n")
            };
            let answer = format!(
                "HTTP/1.1 {code}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes()).await;
        });
    }
}

/// The leader's work: jobs one after another, each finished before the
/// term returns when it is told to step down.
async fn lead(name: &str, term: LockGuard) -> Result<(), volcano::Error> {
    let fence = term.lease().fencing_token();
    println!("{name}: leading with fencing token {fence}");
    let mut job = 0;
    while !term.is_stepping_down() {
        job += 1;
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(700)) => {} // the job, written with `fence`
            () = term.lost() => return Ok(()), // dropped by `run` at once anyway
        }
        if term.is_stepping_down() {
            println!("{name}: finished job {job}, then stepping down");
        }
    }
    Ok(())
}

/// One replica: its probes on `listener`, leading until `stop` fires.
async fn replica(
    name: &'static str,
    client: Client,
    listener: TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    poll: Duration,
) -> Result<(), volcano::Error> {
    let leader = client.locks().leader(KEY, TTL).poll_interval(poll);
    tokio::spawn(serve_probes(listener, leader.status(), leader.health()));
    let result = leader
        .until(stop)
        .drain(DRAIN)
        .run(move |term| lead(name, term))
        .await;
    println!("{name}: stopped ({result:?})");
    result
}

/// SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn sigterm() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What a probe at `addr` answers for `path`: its status code.
async fn probe(addr: std::net::SocketAddr, path: &str) -> std::io::Result<u16> {
    let mut conn = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await?;
    Ok(answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0))
}

/// The replica whose `/leader` probe answers 200 (not `except`), asked
/// every 100 ms for up to 20 s.
async fn wait_for_leader(
    addrs: &[std::net::SocketAddr],
    except: Option<usize>,
) -> Result<usize, Box<dyn std::error::Error>> {
    for _ in 0..200 {
        for (i, addr) in addrs.iter().enumerate() {
            if Some(i) != except && probe(*addr, "/leader").await? == 200 {
                return Ok(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("no replica leads".into())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if configured() {
        let addr = std::env::var("PROBE_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
        let client = Client::from_env()?;
        println!("probes on http://{addr}/readyz, /livez and /leader");
        let listener = TcpListener::bind(&addr).await?;
        replica("replica", client.clone(), listener, sigterm(), POLL).await?;
        let unfinished = client.shutdown(Duration::from_secs(5)).await;
        if !unfinished.is_empty() {
            eprintln!("may still hold {unfinished:?} until its ttl");
        }
        return Ok(());
    }

    let server = MockServer::start().await;
    println!("(in-process mock lock server at {})", server.url());
    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b", "replica-c"] {
        let client = Client::for_mock(&server);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let stop_signal = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(replica(
            name,
            client.clone(),
            listener,
            stop_signal,
            DEMO_POLL,
        ));
        replicas.push((name, client, addr, Some(stop), task));
    }

    // Every replica is ready; one takes leader work.
    let addrs: Vec<_> = replicas.iter().map(|r| r.2).collect();
    let leading = wait_for_leader(&addrs, None).await?;
    for (name, _, addr, _, _) in &replicas {
        let ready = probe(*addr, "/readyz").await?;
        let live = probe(*addr, "/livez").await?;
        let lead = probe(*addr, "/leader").await?;
        println!("{name}: /readyz {ready}, /livez {live}, /leader {lead}");
    }

    // Kubernetes stops the leader's pod: SIGTERM, here a oneshot. It drains
    // (finishes its job, still ready and renewing), then releases, and
    // another replica takes over at its next try: within its poll
    // interval (1 s in this demo, 10 s by default).
    println!("\nSIGTERM to {}", replicas[leading].0);
    if let Some(stop) = replicas[leading].3.take() {
        let _ = stop.send(());
    }
    let (_, _, _, _, task) = &mut replicas[leading];
    task.await??;
    let next = wait_for_leader(&addrs, Some(leading)).await?;
    println!("{} leads now", replicas[next].0);

    // The rest of the deployment goes away too.
    for (_, client, _, stop, task) in replicas {
        if let Some(stop) = stop {
            let _ = stop.send(());
            task.await??;
        }
        let unfinished = client.shutdown(Duration::from_secs(5)).await;
        assert!(unfinished.is_empty(), "still held: {unfinished:?}");
    }
    Ok(())
}

/// Whether the environment names a lock service: `VOLCANO_API_URL` or
/// `VOLCANO_SERVICE_KEY` set. Only when neither is does this example run on
/// an in-process mock server. (In your app, keep the SDK's `mock` feature
/// under `[dev-dependencies]`: a mock is for tests.)
fn configured() -> bool {
    [volcano::ENV_API_URL, volcano::ENV_SERVICE_KEY]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
