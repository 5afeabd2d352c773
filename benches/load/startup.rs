//! Benchmark 5, what the mock server costs a test suite:
//! `MockServer::start()` and drop, one at a time and 200 at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use volcano_mock_server::MockServer;

use crate::measure::{machine, percentile, report, rss_kib};

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
pub(crate) fn startup() {
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
