//! What `volcano::tower::LockLayer` costs over a bare `with_lock`: one free
//! lock, a call that does nothing, on the mock server over loopback.
//! Prints the requests each call sent and its wall time (median and p99,
//! and the spread of the rounds' medians), for both, in alternating
//! rounds, and the layer's extra.
//!
//! ```sh
//! cargo bench -p volcano --features tower --bench layered
//! ```

use std::time::{Duration, Instant};

use tower::{BoxError, Service as _, ServiceBuilder, ServiceExt as _};
use volcano::tower::LockLayer;
use volcano::{Client, Error};
use volcano_mock_server::MockServer;

const CALLS: usize = 500;
const ROUNDS: usize = 6;
const TTL: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = MockServer::start().await;
    let client = Client::builder()
        .service_key(server.service_key())
        .api_url(server.url())
        .build()
        .expect("a mock client");
    let locks = client.locks();

    // Warm up the connection pool and the server.
    for _ in 0..200 {
        locks
            .with_lock("bench", TTL, |_| async { Ok::<_, Error>(()) })
            .await
            .unwrap();
    }

    let mut svc = ServiceBuilder::new()
        .layer(LockLayer::new(locks.clone(), TTL, |_: &()| {
            "bench".to_owned()
        }))
        .service_fn(|()| async { Ok::<_, BoxError>(()) });
    // Rounds that alternate, so that drift (a warming cache, another
    // process) touches both alike; each round's median, then all calls.
    let (mut bare, mut layered) = (Vec::new(), Vec::new());
    let (mut bare_medians, mut layered_medians) = (Vec::new(), Vec::new());
    let (mut bare_requests, mut layered_requests) = (0, 0);
    for _ in 0..ROUNDS {
        let before = server.requests().len();
        let mut round = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let began = Instant::now();
            locks
                .with_lock("bench", TTL, |_| async { Ok::<_, Error>(()) })
                .await
                .unwrap();
            round.push(began.elapsed());
        }
        bare_requests += server.requests().len() - before;
        bare_medians.push(percentiles(&mut round).0);
        bare.extend(round);

        let before = server.requests().len();
        let mut round = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let began = Instant::now();
            svc.ready().await.unwrap().call(()).await.unwrap();
            round.push(began.elapsed());
        }
        layered_requests += server.requests().len() - before;
        layered_medians.push(percentiles(&mut round).0);
        layered.extend(round);
    }
    let total = (ROUNDS * CALLS) as f64;
    let (bare_p50, bare_p99) = percentiles(&mut bare);
    let (layered_p50, layered_p99) = percentiles(&mut layered);
    let range = |medians: &mut Vec<Duration>| {
        medians.sort();
        (medians[0], medians[medians.len() - 1])
    };
    let (bare_lo, bare_hi) = range(&mut bare_medians);
    let (layered_lo, layered_hi) = range(&mut layered_medians);
    println!("one free lock, {ROUNDS} alternating rounds of {CALLS} calls each, a call that does nothing:");
    println!(
        "  with_lock:         {:.2} requests/call, p50 {bare_p50:?}, p99 {bare_p99:?}, round medians {bare_lo:?}..{bare_hi:?}",
        bare_requests as f64 / total
    );
    println!(
        "  LockLayer (tower): {:.2} requests/call, p50 {layered_p50:?}, p99 {layered_p99:?}, round medians {layered_lo:?}..{layered_hi:?}",
        layered_requests as f64 / total
    );
    println!(
        "  the layer's extra: {:+.2} requests/call, p50 {:+.1} µs",
        (layered_requests as f64 - bare_requests as f64) / total,
        (layered_p50.as_secs_f64() - bare_p50.as_secs_f64()) * 1e6
    );
    client.shutdown(Duration::from_secs(5)).await;
}

/// The median and the 99th percentile.
fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}
