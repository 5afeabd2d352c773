//! Load benchmarks (DESIGN section 7). Each prints a table and keeps it in
//! `target/benchmarks/`; `VOLCANO_BENCH_UPDATE_DOCS=1` also updates its
//! section of the tracked `docs/benchmarks.md`:
//!
//! ```sh
//! cargo bench -p volcano --bench load -- overhead     # SDK vs bare reqwest, same requests
//! cargo bench -p volcano --bench load -- throughput   # mock server vs a no-op handler, 64 connections
//! cargo bench -p volcano --bench load -- scale        # 10,000 with_lock guards for 30 s (+ 5 % 503s)
//! cargo bench -p volcano --bench load -- latency      # acquire latency, 1 and 64 clients
//! cargo bench -p volcano --bench load -- startup      # MockServer::start() and drop, 1 and 200 instances
//! cargo bench -p volcano --bench load                 # all five
//! cargo bench -p volcano --bench load -- instructions # callgrind: instructions per pair (valgrind)
//! ```
//!
//! The server runs in a child process (this binary again, `--serve`), so
//! the client's CPU and memory are measured alone. The throughput
//! benchmark's no-op baseline is a server of its own, in [`baseline`]: it
//! is not part of the mock server.

#[path = "load/baseline.rs"]
mod baseline;
#[path = "load/instructions.rs"]
mod instructions;
#[path = "load/latency.rs"]
mod latency;
#[path = "load/measure.rs"]
mod measure;
#[path = "load/overhead.rs"]
mod overhead;
#[path = "load/paced.rs"]
mod paced;
#[path = "load/raw_load.rs"]
mod raw_load;
#[path = "load/scale.rs"]
mod scale;
#[path = "load/server.rs"]
mod server;
#[path = "load/startup.rs"]
mod startup;
#[path = "load/throughput.rs"]
mod throughput;

use std::time::Duration;

use instructions::{instructions, pairs_only};
use latency::latency;
use overhead::overhead;
use scale::{scale, scale_guards, scale_run};
use server::serve;
use startup::startup;
use throughput::throughput;

const TOKEN: &str = "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(args.get(i + 1).map_or("mock", String::as_str));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--pairs") {
        let who = args.get(i + 1).cloned().unwrap_or_default();
        let count = args.get(i + 2).and_then(|v| v.parse().ok()).unwrap_or(1000);
        pairs_only(&who, count);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--scale-run") {
        let every = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0);
        let held_locks = args.get(i + 2).is_some_and(|v| v == "hold");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let hold = Duration::from_secs(30);
        let run = runtime.block_on(scale_run(scale_guards(), hold, every, held_locks));
        println!("{}", run.to_json());
        return;
    }
    let which = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .cloned()
        .unwrap_or_else(|| "all".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let run = |name: &str| which == "all" || which == name;
        if run("overhead") {
            overhead().await;
        }
        if run("throughput") {
            throughput().await;
        }
        if run("scale") {
            scale().await;
        }
        if run("latency") {
            latency().await;
        }
    });
    if which == "all" || which == "startup" {
        startup();
    }
    // Not part of "all": it needs valgrind and takes minutes.
    if which == "instructions" {
        instructions();
    }
}
