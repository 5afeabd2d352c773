//! What `volcano::tower::LockLayer` costs over a bare `with_lock`: one free
//! lock, a call that does nothing, on the mock server over loopback.
//! Prints the requests each call sent and its wall time (median and p99),
//! for both, and the layer's extra.
//!
//! ```sh
//! cargo bench -p volcano --features tower --bench layered
//! ```

use std::time::{Duration, Instant};

use tower::{BoxError, Service as _, ServiceBuilder, ServiceExt as _};
use volcano::tower::LockLayer;
use volcano::{Client, Error};
use volcano_mock_server::MockServer;

const CALLS: usize = 2_000;
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

    let before = server.requests().len();
    let mut bare = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let began = Instant::now();
        locks
            .with_lock("bench", TTL, |_| async { Ok::<_, Error>(()) })
            .await
            .unwrap();
        bare.push(began.elapsed());
    }
    let bare_requests = server.requests().len() - before;

    let mut svc = ServiceBuilder::new()
        .layer(LockLayer::new(locks.clone(), TTL, |_: &()| {
            "bench".to_owned()
        }))
        .service_fn(|()| async { Ok::<_, BoxError>(()) });
    let before = server.requests().len();
    let mut layered = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let began = Instant::now();
        svc.ready().await.unwrap().call(()).await.unwrap();
        layered.push(began.elapsed());
    }
    let layered_requests = server.requests().len() - before;

    let (bare_p50, bare_p99) = percentiles(&mut bare);
    let (layered_p50, layered_p99) = percentiles(&mut layered);
    println!("one free lock, {CALLS} calls each, a call that does nothing:");
    println!(
        "  with_lock:        {:.2} requests/call, p50 {bare_p50:?}, p99 {bare_p99:?}",
        bare_requests as f64 / CALLS as f64
    );
    println!(
        "  LockLayer (tower): {:.2} requests/call, p50 {layered_p50:?}, p99 {layered_p99:?}",
        layered_requests as f64 / CALLS as f64
    );
    println!(
        "  the layer's extra: {:+.2} requests/call, p50 {:+.1} µs",
        (layered_requests as f64 - bare_requests as f64) / CALLS as f64,
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
