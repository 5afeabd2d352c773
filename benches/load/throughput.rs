//! Benchmark 2, mock server throughput: pairs per second from the raw
//! load generator ([`raw_load`](crate::raw_load)), against the mock server
//! and the no-op baseline.

use crate::measure::{machine, median, report};
use crate::raw_load;
use crate::server::Server;
use crate::TOKEN;

/// One round on one server: pairs per second, and the share of a core each
/// process used.
struct Round {
    pairs_per_sec: f64,
    generator_cores: f64,
    server_cores: f64,
}

fn round(server: &Server, connections: usize, seconds: f64) -> Round {
    let addr = server.addr();
    let server_before = server.cpu_seconds();
    let run = raw_load::run(
        addr,
        &format!("Bearer {}", server.key),
        TOKEN,
        connections,
        seconds,
    );
    let server_cpu = server.cpu_seconds() - server_before;
    Round {
        pairs_per_sec: run.pairs as f64 / run.seconds,
        generator_cores: run.cpu / run.seconds,
        server_cores: server_cpu / run.seconds,
    }
}

pub(crate) async fn throughput() {
    const CONNECTIONS: usize = 64;
    const SECONDS: f64 = 6.0;
    const ROUNDS: usize = 5;
    let mock = Server::start("mock");
    let baseline = Server::start("baseline");
    // Warm both up (connections, allocator, the mock's maps).
    round(&mock, CONNECTIONS, 1.0);
    round(&baseline, CONNECTIONS, 1.0);
    let (mut on_mock, mut on_baseline, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = String::new();
    for i in 0..ROUNDS {
        // Alternate which goes first, so drift hits both alike.
        let (m, b) = if i % 2 == 0 {
            let m = round(&mock, CONNECTIONS, SECONDS);
            (m, round(&baseline, CONNECTIONS, SECONDS))
        } else {
            let b = round(&baseline, CONNECTIONS, SECONDS);
            (round(&mock, CONNECTIONS, SECONDS), b)
        };
        // A fresh journal and store each round, as a test suite would have.
        mock.control("reset", "").await;
        rows.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |\n",
            i + 1,
            m.pairs_per_sec,
            m.server_cores,
            m.generator_cores,
            b.pairs_per_sec,
            b.server_cores,
            b.generator_cores,
            m.pairs_per_sec / b.pairs_per_sec
        ));
        ratios.push(m.pairs_per_sec / b.pairs_per_sec);
        on_mock.push(m);
        on_baseline.push(b);
    }
    let per_sec =
        |rounds: &[Round]| median(&mut rounds.iter().map(|r| r.pairs_per_sec).collect::<Vec<_>>());
    let (m, b) = (per_sec(&on_mock), per_sec(&on_baseline));
    let ratio = median(&mut ratios);
    let generator_max = on_mock
        .iter()
        .chain(&on_baseline)
        .map(|r| r.generator_cores)
        .fold(0.0, f64::max);
    let verdict = if ratio >= 0.8 { "met" } else { "NOT met" };
    let bound = if generator_max < 0.9 {
        format!(
            "The generator's one thread never used more than {generator_max:.2} of a core, so it \
             was never the bottleneck: each server was, on the core and a bit the generator left it."
        )
    } else {
        format!(
            "The generator's thread used up to {generator_max:.2} of a core: it may have bounded \
             some rounds, and the ratio may understate the difference."
        )
    };
    report(
        "throughput",
        "2. Mock server throughput",
        &format!(
            "{}\n\nAcquire + release pairs per second from {CONNECTIONS} keep-alive connections \
             (one key each), {ROUNDS} interleaved rounds of {SECONDS} s per server. The load \
             generator writes pre-built requests and reads answers with minimal parsing, on one \
             thread of its own process; the server runs in another (2 worker threads). Cores: the \
             CPU time each process used over the round, per second.\n\n\
             | round | mock pairs/s | mock server cores | generator cores | no-op pairs/s | no-op server cores | generator cores | ratio |\n\
             |---|---|---|---|---|---|---|---|\n{rows}\n\
             Median: mock **{m:.0}** pairs/s, no-op handler on the same stack {b:.0}; median \
             ratio **{ratio:.2}** (target ≥ 0.8: {verdict}). {bound}",
            machine()
        ),
    );
}
