//! What the scale benchmark compares the SDK's renewals with: the same
//! renewals from a bare `reqwest::Client`, back to back
//! ([`bare_renewals`]) and on the guard's schedule ([`paced_renewals`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use volcano::Client;

use crate::measure::{cpu_seconds, wakeups};
use crate::server::Server;

#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct PacedRun {
    pub(crate) requests: usize,
    pub(crate) cpu: f64,
    pub(crate) wakeups_per_sec: f64,
}

/// The client CPU seconds a bare `reqwest::Client` spends sending `count`
/// renewals of `lease` (the SDK's method, path, headers and body), 64 in
/// flight at a time.
pub(crate) async fn bare_renewals(
    server: &Server,
    lease: &volcano::LockLease,
    count: usize,
) -> f64 {
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
pub(crate) async fn paced_renewals(
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
