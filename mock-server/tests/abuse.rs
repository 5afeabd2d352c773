//! Abuse of the mock server: slow clients, oversized bodies, invalid UTF-8,
//! and thousands of keys. It keeps serving everyone else and its memory
//! stays bounded.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use volcano_mock_server::MockServer;

const RID: &str = "11111111-2222-4333-8444-555555555555";

/// Sends raw bytes and returns what came back before the server closed or
/// `limit` passed.
async fn raw(server: &MockServer, request: &[u8], limit: Duration) -> String {
    let mut stream = TcpStream::connect(server.addr()).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(limit, stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or_default()
}

async fn get_ok(server: &MockServer) -> Duration {
    let started = Instant::now();
    let response = reqwest::Client::new()
        .get(format!("{}/locks/k", server.url()))
        .bearer_auth(server.service_key())
        .header("x-volcano-request-id", RID)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_while_others_are_served() {
    let server = MockServer::builder()
        .header_read_timeout(Duration::from_secs(1))
        .start()
        .await;
    let mut slow = Vec::new();
    for i in 0..200 {
        let mut stream = TcpStream::connect(server.addr()).await.unwrap();
        stream
            .write_all(b"GET /locks/k HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(tokio::spawn(async move {
            // Some trickle a byte every 100 ms, some just sit there.
            if i % 2 == 0 {
                for _ in 0..40 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if stream.write_all(b"X").await.is_err() {
                        break;
                    }
                }
            }
            let mut rest = Vec::new();
            let started = Instant::now();
            let _ =
                tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
            started.elapsed()
        }));
    }
    let mut worst = Duration::ZERO;
    for _ in 0..50 {
        worst = worst.max(get_ok(&server).await);
    }
    eprintln!("slowest of 50 requests while 200 slow clients were connected: {worst:?}");
    assert!(worst < Duration::from_secs(1), "{worst:?}");
    for task in slow {
        let waited = task.await.unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "a slow client kept its connection for {waited:?}"
        );
    }
}

#[tokio::test]
async fn oversized_and_lying_bodies_get_400_and_nothing_breaks() {
    let server = MockServer::start().await;
    let big = reqwest::Client::new()
        .post(format!("{}/locks/k/lease", server.url()))
        .bearer_auth(server.service_key())
        .header("x-volcano-request-id", RID)
        .header("x-volcano-lock-token", RID)
        .body(vec![b' '; 10 << 20])
        .send()
        .await;
    // The server may answer 400 before reading it all, or close the socket.
    if let Ok(response) = big {
        assert_eq!(response.status(), 400);
    }
    let request = format!(
        "POST /locks/k/lease HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         X-Volcano-Request-Id: {RID}\r\nX-Volcano-Lock-Token: {RID}\r\n\
         Content-Length: 100000000\r\n\r\n{{\"ttl_seconds\":30}}",
        server.service_key()
    );
    let answer = raw(&server, request.as_bytes(), Duration::from_secs(3)).await;
    assert_eq!(status_line(&answer), "HTTP/1.1 400 Bad Request", "{answer}");

    // A body that is promised but never finishes: refused after the timeout.
    let server = MockServer::builder()
        .header_read_timeout(Duration::from_millis(500))
        .start()
        .await;
    let request = format!(
        "POST /locks/k/lease HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         X-Volcano-Request-Id: {RID}\r\nX-Volcano-Lock-Token: {RID}\r\n\
         Content-Length: 1000\r\n\r\n{{\"ttl_seconds\":",
        server.service_key()
    );
    let started = Instant::now();
    let answer = raw(&server, request.as_bytes(), Duration::from_secs(5)).await;
    assert_eq!(status_line(&answer), "HTTP/1.1 400 Bad Request", "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(server.locks().is_empty());
    get_ok(&server).await;
}

#[tokio::test]
async fn invalid_utf8_in_paths_and_headers_is_refused() {
    let server = MockServer::start().await;
    let key = server.service_key().to_owned();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GET /locks/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "HTTP/1.1 400"),
        (
            format!("GET /locks/%FF%FE HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nX-Volcano-Request-Id: {RID}\r\nConnection: close\r\n\r\n")
                .into_bytes(),
            "HTTP/1.1 400",
        ),
        (
            [
                format!("GET /locks/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nX-Volcano-Request-Id: ").as_bytes(),
                b"\xff\xfe\xfd",
                b"\r\nConnection: close\r\n\r\n",
            ]
            .concat(),
            "HTTP/1.1 400",
        ),
        (
            b"GET /locks/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n".to_vec(),
            "HTTP/1.1 401",
        ),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n".to_vec(), ""),
    ];
    for (request, expected) in cases {
        let answer = raw(&server, &request, Duration::from_secs(3)).await;
        assert!(
            status_line(&answer).starts_with(expected),
            "{:?} -> {answer:?}",
            String::from_utf8_lossy(&request)
        );
        assert!(!answer.starts_with("HTTP/1.1 5"), "{answer}");
    }
    get_ok(&server).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_keys_leave_memory_bounded() {
    const KEYS: usize = 10_000;
    let server = MockServer::start().await;
    let http = reqwest::Client::new();
    let mut after_cycle = Vec::new();
    for cycle in 0..3 {
        let mut tasks = Vec::new();
        for worker in 0..16 {
            let (http, url, key) = (
                http.clone(),
                server.url().to_owned(),
                server.service_key().to_owned(),
            );
            tasks.push(tokio::spawn(async move {
                for i in (worker..KEYS).step_by(16) {
                    let response = http
                        .post(format!("{url}/locks/c{cycle}-key-{i}/lease"))
                        .bearer_auth(&key)
                        .header("x-volcano-request-id", RID)
                        .header("x-volcano-lock-token", RID)
                        .body(r#"{"ttl_seconds":60}"#)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 201);
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(server.lease_count(), KEYS);
        // A minute's ttl: creating them all takes seconds on a busy
        // machine, and none may expire before they are counted.
        server.advance(Duration::from_secs(62));
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.lease_count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(server.lease_count(), 0, "expired leases are swept");
        server.reset(); // drop the journal too
        after_cycle.push(rss_kib());
    }
    eprintln!("RSS after each cycle of {KEYS} keys (KiB): {after_cycle:?}");
    let (first, last) = (after_cycle[0], after_cycle[2]);
    assert!(
        last <= first + first / 5 + 4_096,
        "memory grew: {after_cycle:?}"
    );
}

#[tokio::test]
async fn a_huge_header_read_timeout_does_not_break_connections() {
    let server = MockServer::builder()
        .header_read_timeout(Duration::MAX)
        .start()
        .await;
    get_ok(&server).await;
}

#[tokio::test]
async fn chunked_bodies_over_the_limit_get_400_on_routes_that_ignore_them() {
    let server = MockServer::start().await;
    let chunk = "x".repeat(70 * 1024);
    for head in [
        format!(
            "GET /locks/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             X-Volcano-Request-Id: {RID}\r\n",
            server.service_key()
        ),
        "GET /__mock/locks HTTP/1.1\r\nHost: x\r\n".to_owned(),
    ] {
        let request = format!(
            "{head}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len()
        );
        let answer = raw(&server, request.as_bytes(), Duration::from_secs(5)).await;
        assert_eq!(status_line(&answer), "HTTP/1.1 400 Bad Request", "{head}");
    }
    get_ok(&server).await;
}

/// Faults posted in a loop (never matched, never used up) are bounded: past
/// `MAX_FAULTS` a post gets a 409 that says what to do, memory stays flat,
/// and a lock request is still served at once. Statuses that are not final
/// HTTP statuses, keys no lock request can have, and `times: 0`, are
/// refused with 400.
#[tokio::test]
async fn faults_are_bounded_and_invalid_ones_refused() {
    use volcano_mock_server::{Fault, InvalidFault, MAX_FAULTS};
    let server = MockServer::start().await;
    let http = reqwest::Client::new();
    let faults = format!("{}/__mock/faults", server.url());
    let post = |body: String| http.post(&faults).body(body).send();
    for status in [0, 42, 100, 101, 199, 600, 65535] {
        let body = format!(r#"{{"kind":"status","status":{status}}}"#);
        let answer = post(body).await.unwrap();
        assert_eq!(answer.status(), 400, "status {status}");
        let text = answer.text().await.unwrap();
        assert!(text.contains("200..=599"), "{text}");
    }
    let long_key = "k".repeat(60_000);
    for key in ["", "bad key", "-leading", long_key.as_str()] {
        let body = serde_json::json!({"kind": "reset", "key": key}).to_string();
        let answer = post(body).await.unwrap();
        assert_eq!(answer.status(), 400, "key {:.20}", key);
        let text = answer.text().await.unwrap();
        assert!(text.len() < 1_000, "the answer quotes a bounded key");
    }
    assert_eq!(
        server.try_inject(Fault::status(101)),
        Err(InvalidFault::Status(101))
    );
    // A fault that can never apply holds no slot: refused over HTTP as in
    // process, with the reason.
    let never = post(r#"{"kind":"status","status":503,"times":0}"#.into())
        .await
        .unwrap();
    assert_eq!(never.status(), 400);
    let text = never.text().await.unwrap();
    assert!(text.contains("times 0 never applies"), "{text}");
    assert_eq!(
        server.try_inject(Fault::status(503).times(0)),
        Err(InvalidFault::NeverApplies)
    );

    let before = rss_kib();
    let mut refused = 0;
    for i in 0..3_000 {
        let key = format!("never-{i}-{}", "x".repeat(100));
        let body = format!(r#"{{"kind":"status","status":503,"key":"{key}"}}"#);
        let answer = post(body).await.unwrap();
        match answer.status().as_u16() {
            201 => assert!(i < MAX_FAULTS, "accepted past the limit"),
            409 => {
                refused += 1;
                let text = answer.text().await.unwrap();
                assert!(text.contains("/__mock/reset"), "{text}");
            }
            other => panic!("status {other}"),
        }
    }
    assert_eq!(refused, 3_000 - MAX_FAULTS);
    assert_eq!(
        server.try_inject(Fault::status(503)),
        Err(InvalidFault::TooMany)
    );
    let grown = rss_kib().saturating_sub(before);
    eprintln!("RSS grew {grown} KiB for {MAX_FAULTS} pending faults");
    assert!(grown < 16 * 1024, "grew {grown} KiB");
    assert!(get_ok(&server).await < Duration::from_secs(1));
    // Cleared, faults are accepted again.
    let cleared = http.delete(&faults).send().await.unwrap();
    assert_eq!(cleared.status(), 204);
    assert_eq!(
        post(r#"{"kind":"reset"}"#.into()).await.unwrap().status(),
        201
    );
}
