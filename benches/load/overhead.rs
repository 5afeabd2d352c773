//! Benchmark 1, SDK overhead: acquire + release pairs through the SDK
//! against the same requests from a bare reqwest client.

use std::time::{Duration, Instant};

use crate::measure::{machine, median, micros, report};
use crate::server::Server;
use crate::TOKEN;

/// One acquire+release pair with a bare reqwest client: the same method,
/// path, headers and body as the SDK sends.
pub(crate) async fn raw_pair(http: &reqwest::Client, url: &str, auth: &str, request_id: &str) {
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

pub(crate) async fn sdk_pair(locks: &volcano::Locks) {
    let lease = locks
        .acquire("overhead", Duration::from_secs(30))
        .token(TOKEN)
        .await
        .unwrap();
    locks.release(&lease).await.unwrap();
}

pub(crate) async fn overhead() {
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
