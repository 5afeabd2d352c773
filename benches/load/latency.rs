//! Benchmark 4, acquire latency on loopback: one client and 64.

use std::time::{Duration, Instant};

use crate::measure::{machine, micros, percentile, report};
use crate::server::Server;

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

pub(crate) async fn latency() {
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
