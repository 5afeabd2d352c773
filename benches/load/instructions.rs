//! Instructions per acquire + release pair, counted by callgrind
//! (`-- instructions`; needs valgrind), client and server.

use std::process::{Command, Stdio};

use crate::measure::{machine, report};
use crate::overhead::{raw_pair, sdk_pair};
use crate::raw_load;
use crate::server::Server;
use crate::TOKEN;

/// Child-process mode for [`instructions`]: `count` acquire + release
/// pairs, SDK (`sdk`) or bare reqwest (`bare`), on a current-thread runtime
/// against a mock server in a child process of its own, after 50 of each
/// to warm up.
pub(crate) fn pairs_only(who: &str, count: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = Server::start("mock");
        let locks = server.client().locks();
        let http = reqwest::Client::builder()
            .user_agent("bench")
            .build()
            .unwrap();
        let auth = format!("Bearer {}", server.key);
        let request_id = uuid::Uuid::new_v4().to_string();
        for _ in 0..50 {
            sdk_pair(&locks).await;
            raw_pair(&http, &server.url, &auth, &request_id).await;
        }
        for _ in 0..count {
            if who == "sdk" {
                sdk_pair(&locks).await;
            } else {
                raw_pair(&http, &server.url, &auth, &request_id).await;
            }
        }
    });
}

/// Where callgrind writes the counts of the run named `label`.
fn callgrind_out(label: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/benchmarks");
    std::fs::create_dir_all(dir).unwrap();
    format!("{dir}/callgrind-{label}.out")
}

/// valgrind's callgrind, counting into [`callgrind_out`]`(label)`; only the
/// process it starts is counted (children run natively).
fn valgrind(label: &str) -> Command {
    let mut command = Command::new("valgrind");
    command.args([
        "--tool=callgrind",
        "-q",
        &format!("--callgrind-out-file={}", callgrind_out(label)),
    ]);
    command
}

/// The instructions the finished run named `label` executed.
fn callgrind_total(label: &str) -> u64 {
    let path = callgrind_out(label);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no total in {path}"))
}

/// Instructions per acquire + release pair, counted by callgrind (which
/// counts the same whatever else the machine does): on the client, SDK
/// against bare reqwest; on the server, the mock against the no-op
/// baseline, driven by the raw generator. Each is run at two lengths and
/// the difference divided, so start-up and warm-up cancel out.
pub(crate) fn instructions() {
    const SHORT: usize = 1_000;
    const LONG: usize = 3_000;
    let exe = std::env::current_exe().unwrap();
    let per_pair = |label: &str, run: &dyn Fn(&str, usize) -> u64| {
        let short = run(&format!("{label}-{SHORT}"), SHORT);
        let long = run(&format!("{label}-{LONG}"), LONG);
        long.saturating_sub(short) as f64 / (LONG - SHORT) as f64
    };
    let client = |who: &'static str| {
        let exe = exe.clone();
        move |label: &str, count: usize| {
            let status = valgrind(label)
                .arg(&exe)
                .args(["--pairs", who, &count.to_string()])
                .stdout(Stdio::null())
                .status()
                .expect("valgrind runs (apt install valgrind)");
            assert!(status.success(), "{label}: {status}");
            callgrind_total(label)
        }
    };
    let sdk = per_pair("client-sdk", &client("sdk"));
    let bare = per_pair("client-bare", &client("bare"));
    let server = |kind: &'static str| {
        let exe = exe.clone();
        move |label: &str, count: usize| {
            let mut command = valgrind(label);
            command.arg(&exe).args(["--serve", kind]);
            let server = Server::spawn(&mut command);
            raw_load::run_pairs(
                server.addr(),
                &format!("Bearer {}", server.key),
                TOKEN,
                8,
                count,
            );
            // Closing its standard input ends it; callgrind writes on exit.
            drop(server);
            callgrind_total(label)
        }
    };
    let mock = per_pair("server-mock", &server("mock"));
    let noop = per_pair("server-baseline", &server("baseline"));
    report(
        "instructions",
        "1b. Instructions per pair (callgrind)",
        &format!(
            "{}\n\n`cargo bench -p volcano --bench load -- instructions`: `valgrind --tool=callgrind` on one \
             process at a time, {SHORT} and {LONG} acquire + release pairs after a warm-up, the \
             difference divided by {}. The client runs on a current-thread runtime; the server \
             is driven by the raw load generator over 8 connections.\n\n\
             | process | instructions per pair | ratio |\n|---|---|---|\n\
             | client: volcano SDK | {:.1}k | {:.3} |\n\
             | client: bare reqwest, same requests | {:.1}k | 1 |\n\
             | server: mock lock server | {:.1}k | {:.2} |\n\
             | server: no-op handler, same stack | {:.1}k | 1 |",
            machine(),
            LONG - SHORT,
            sdk / 1e3,
            sdk / bare,
            bare / 1e3,
            mock / 1e3,
            mock / noop,
            noop / 1e3,
        ),
    );
}
