//! `volcano-e2e`: the lock client and its fencing store where a user's
//! system runs them. Real processes (library workers and `volcano locks
//! run` commands) take locks from the standalone mock server (its quota
//! on) through a fault proxy, and increment counters in PostgreSQL under
//! two roles with their own schemas; a seeded schedule pauses holders past
//! their ttl (SIGSTOP, then SIGCONT), kills them (SIGKILL), stops them
//! (SIGTERM), partitions them, holds answers the service applied, and
//! storms the service with 503s and 429s. Then it checks what PostgreSQL
//! committed against what the service granted and what each process
//! said (`checks.rs`).
//!
//! The same schedule runs twice: through the fence, and with the fence
//! check off (the control, which must lose updates, or the faults did not
//! bite).
//!
//! ```text
//! cargo build --workspace --all-features --bins
//! target/debug/volcano-e2e --secs 60 [--seed N] [--only fenced|control]
//! ```

mod checks;
mod db;
mod processes;
mod proxy;
mod schedule;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::Signal;
use serde_json::Value;

use checks::{Evidence, Grant, Verdict};
use processes::{family, lock, signal, signal_family, slot, start_mock, Setting, Shared, SLOTS};
use proxy::{Mode, Proxy};
use schedule::{schedule, Faults, Until};

/// The keys the workers share.
const KEYS: [&str; 3] = ["e2e-a", "e2e-b", "e2e-c"];

/// A journal time (RFC 3339), in milliseconds since the epoch.
fn epoch_ms(at: &Value) -> Option<i64> {
    let at = chrono::DateTime::parse_from_rfc3339(at.as_str()?).ok()?;
    Some(at.timestamp_millis())
}

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

struct Args {
    seed: u64,
    secs: u64,
    ttl: u64,
    runs: Vec<bool>,
    bin: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut seed = None;
    let mut secs = 60;
    let mut ttl = 5;
    // The control first: it runs until it has lost an update, and the
    // fenced run then runs as long, with the same schedule.
    let mut runs = vec![false, true];
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--seed" => seed = Some(value()?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--secs" => secs = value()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--ttl" => ttl = value()?.parse().map_err(|e| format!("--ttl: {e}"))?,
            "--only" => {
                runs = match value()?.as_str() {
                    "fenced" => vec![true],
                    "control" => vec![false],
                    other => return Err(format!("--only fenced|control, not {other:?}")),
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = exe.parent().ok_or("no binary folder")?.to_path_buf();
    for needed in ["volcano", "volcano-mock-server", "e2e-worker"] {
        if !bin.join(needed).exists() {
            return Err(format!(
                "{} is missing: cargo build --workspace --all-features --bins",
                bin.join(needed).display()
            ));
        }
    }
    Ok(Args {
        seed: seed.unwrap_or_else(rand::random),
        secs,
        ttl,
        runs,
        bin,
    })
}

/// One run: everything started afresh, the schedule, the end, the checks.
async fn run(
    a: &Args,
    pg_url: &str,
    fenced: bool,
    secs: Option<f64>,
) -> Result<(Verdict, Faults, usize), String> {
    let name = if fenced { "e2e_fenced" } else { "e2e_control" };
    let db_urls = db::prepare(pg_url, name, &KEYS).await?;
    let (mut mock, mock_addr) = tokio::time::timeout(Duration::from_secs(30), start_mock(&a.bin))
        .await
        .map_err(|_| "the mock server did not start within 30 s".to_owned())??;
    let mock_url = format!("http://{mock_addr}");
    let proxy = Proxy::start(mock_addr)
        .await
        .map_err(|e| format!("starting the proxy: {e}"))?;
    let setting = Arc::new(Setting {
        bin: a.bin.clone(),
        api: format!("http://{}", proxy.addr),
        db_urls,
        fenced,
        ttl: a.ttl,
        seed: a.seed,
    });
    let shared: Shared = Arc::default();
    let slots: Vec<_> = (0..SLOTS.len())
        .map(|i| tokio::spawn(slot(setting.clone(), shared.clone(), i)))
        .collect();
    let until = match secs {
        Some(secs) => Until::Secs(Duration::from_secs_f64(secs)),
        None => Until::Lost {
            min: Duration::from_secs(a.secs),
            max: Duration::from_secs(a.secs * 4),
            db: (pg_url, name),
        },
    };
    let faults = schedule(a.seed, &until, a.ttl, &proxy, &mock_url, &shared).await;

    // The end: the network healed, the service's faults cleared, every
    // process resumed and asked to stop; the leases checked at once.
    proxy.set(Mode::Pass);
    let http = reqwest::Client::new();
    let _ = http
        .delete(format!("{mock_url}/__mock/faults"))
        .send()
        .await;
    let live: Vec<u32> = {
        let mut p = lock(&shared);
        p.stopping = true;
        p.live.values().copied().collect()
    };
    for pid in &live {
        for member in family(*pid) {
            signal(member, Signal::CONT);
        }
        signal(*pid, Signal::TERM);
    }
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        for s in slots {
            let _ = s.await;
        }
    })
    .await;
    if ended.is_err() {
        let left: Vec<String> = lock(&shared).live.keys().cloned().collect();
        for pid in lock(&shared).live.values() {
            signal_family(*pid, Signal::KILL);
        }
        return Err(format!(
            "processes did not end within 20 s of SIGTERM: {}",
            left.join(", ")
        ));
    }
    let locks: Vec<Value> = get_json(&http, &format!("{mock_url}/__mock/locks")).await?;
    let journal: Vec<Value> = get_json(&http, &format!("{mock_url}/__mock/requests")).await?;
    let _ = mock.kill().await;

    let grants: Vec<Grant> = journal
        .iter()
        .filter(|r| r["operation"] == "acquire" && r["status"] == 201)
        .filter_map(|r| {
            Some(Grant {
                key: r["key"].as_str()?.to_owned(),
                fence: r["fencing_token"].as_i64()?,
                at_ms: epoch_ms(&r["at"])?,
            })
        })
        .collect();
    let truncated = journal.first().is_some_and(|r| r["seq"] != 1);
    // The service's own 429s (its quota, not an injected storm) slow
    // waiters down as a fault does.
    let mut faults_on: Vec<(i64, i64, &'static str)> = faults
        .on
        .iter()
        .map(|(a, b)| (*a, *b, "network or storm"))
        .collect();
    faults_on.extend(faults.pauses.iter().map(|(a, b)| (*a, *b, "pause")));
    for r in &journal {
        // An injected storm's 429s carry their fault and are in
        // `faults.on` already, for as long as the storm lasted.
        if r["status"] == 429 && r["fault"].is_null() {
            if let Some(at) = epoch_ms(&r["at"]) {
                faults_on.push((at - 1_000, at + 60_000, "the service's 429"));
            }
        }
    }
    let mut expiries: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for r in &journal {
        let granted = (r["operation"] == "acquire" && r["status"] == 201)
            || (r["operation"] == "renew" && r["status"] == 200);
        let (Some(key), Some(fence), Some(at)) = (
            r["key"].as_str(),
            r["fencing_token"].as_i64(),
            epoch_ms(&r["expires_at"]),
        ) else {
            continue;
        };
        if granted {
            let until = expiries.entry((key.to_owned(), fence)).or_default();
            *until = (*until).max(at);
        }
    }
    let live_at_end = locks
        .iter()
        .filter(|l| l["live"] == true)
        .filter_map(|l| Some((l["key"].as_str()?.to_owned(), l["fencing_token"].as_i64()?)))
        .collect();
    let p = std::mem::take(&mut *lock(&shared));
    let outcome = db::outcome(pg_url, name).await?;
    if std::env::var_os("E2E_TRACE").is_some() {
        for w in &outcome.history {
            eprintln!(
                "{} commit {} {} fence {} by {}",
                w.sent_at_ms, w.key, w.value, w.fence, w.worker
            );
        }
        for g in &grants {
            eprintln!("{} grant {} fence {}", g.at_ms, g.key, g.fence);
        }
    }
    let evidence = Evidence {
        fenced,
        db: outcome,
        grants,
        expiries,
        live_at_end,
        said: p.said,
        exits: p.exits,
        killed: p.killed,
        keys_of: p.keys_of,
        faults_on,
        truncated,
    };
    Ok((checks::judge(&evidence), faults, p.started))
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<Vec<Value>, String> {
    http.get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("{url}: {e}"))
}

fn print(fenced: bool, v: &Verdict, faults: &Faults, processes: usize) {
    let what = if fenced {
        "through the fence"
    } else {
        "control, fence off"
    };
    println!("{what}: {:.0} s", faults.secs);
    println!("  processes started: {processes}");
    let kinds: Vec<String> = faults
        .by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!("  faults: {}", kinds.join(", "));
    println!("  pauses longer than the ttl: {}", faults.long_pauses);
    println!(
        "  kills followed by a quiet stretch (ttl + 6 s): {}",
        faults.quiet_after_kills
    );
    println!(
        "  increments committed: {}; holds reported successful: {}; writes refused by the fence: {}",
        v.commits, v.successes, v.refusals
    );
    let hands: Vec<String> = v
        .holders_per_key
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!("  grants per key: {}", hands.join(", "));
    println!(
        "  lost updates: {}; stale commits: {}; untruthful reports: {}; unexplained refusals: {}; leaks: {}",
        v.lost_updates, v.stale_commits, v.untruthful, v.unexplained_refusals, v.leaks
    );
    let by: Vec<String> = v
        .overlapped_by
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!(
        "  takeovers after a kill judged: {}, slowest {} ms, too slow {} (not judged: {} with a fault in the window{}{})",
        v.takeovers_judged,
        v.slowest_takeover_ms,
        v.slow_takeovers,
        v.takeovers_overlapped,
        if by.is_empty() { "" } else { ": " },
        by.join(", ")
    );
    if !v.not_a_case.is_empty() {
        let other: Vec<String> = v
            .not_a_case
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!(
            "  open holds of killed processes not judged: {}",
            other.join(", ")
        );
    }
    for violation in &v.violations {
        println!("  VIOLATION: {violation}");
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(err) => {
            eprintln!("volcano-e2e: {err}");
            return ExitCode::from(2);
        }
    };
    println!(
        "volcano-e2e: seed {}, {} s per run, ttl {} s",
        a.seed, a.secs, a.ttl
    );
    let pg = match volcano_fence::testing::Postgres::shared() {
        Ok(pg) => pg,
        Err(err) => {
            eprintln!("volcano-e2e: no PostgreSQL: {err}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    let mut secs = None;
    for fenced in a.runs.clone() {
        let only = a.runs.len() == 1;
        let this = if fenced || only {
            Some(secs.unwrap_or(a.secs as f64))
        } else {
            None
        };
        match run(&a, pg.url(), fenced, this).await {
            Ok((verdict, faults, processes)) => {
                secs = Some(faults.secs);
                print(fenced, &verdict, &faults, processes);
                let control_bit = fenced || a.runs.len() == 1 || verdict.lost_updates > 0;
                if !control_bit {
                    println!(
                        "  FAILED: the control lost no update: the faults did not bite, and the \
                         fenced run proved nothing"
                    );
                }
                failed |= !verdict.violations.is_empty() || !control_bit;
            }
            Err(err) => {
                println!("run failed: {err}");
                failed = true;
            }
        }
    }
    if failed {
        println!(
            "FAILED. Replay the schedule: target/debug/volcano-e2e --seed {} --secs {} --ttl {}",
            a.seed, a.secs, a.ttl
        );
        return ExitCode::FAILURE;
    }
    println!("passed");
    ExitCode::SUCCESS
}
