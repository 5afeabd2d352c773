//! Benchmark 3, scale: 10,000 guards on one client, each scenario in a
//! process of its own; renewals, losses, memory and CPU over a window.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use volcano::Error;

use crate::measure::{cpu_seconds, machine, median, report, rss_kib, wakeups};
use crate::paced::{bare_renewals, paced_renewals, PacedRun};
use crate::server::Server;

#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct ScaleRun {
    guards: usize,
    renewals: usize,
    renewal_503s: usize,
    losses: usize,
    other_errors: usize,
    rss_per_guard_kib: f64,
    client_cpu: f64,
    server_cpu: f64,
    acquire_secs: f64,
    /// Client CPU of a bare reqwest client sending as many identical
    /// renewal PATCHes (64 at a time) right after the window; hold runs only.
    bare_cpu: f64,
    /// Thread wake-ups a second (voluntary context switches of every
    /// client thread) over the window.
    wakeups_per_sec: f64,
    /// A bare reqwest renewal loop per lock on the same schedule, for as
    /// long as the window; hold clean runs only.
    paced: Option<PacedRun>,
}

impl ScaleRun {
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap()
    }
}

pub(crate) fn scale_guards() -> usize {
    std::env::var("VOLCANO_BENCH_GUARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Runs one scale scenario in a fresh process, so that its memory figure
/// does not include what an earlier run freed.
fn scale_in_child(every: u32, held_locks: bool) -> ScaleRun {
    let kind = if held_locks { "hold" } else { "with_lock" };
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--scale-run", &every.to_string(), kind])
        .stderr(Stdio::inherit())
        .output()
        .expect("the scale run starts");
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default()).expect("scale figures")
}

/// `guards` locks on distinct keys, each a `with_lock` task whose closure
/// sleeps, or (`held_locks`) a `HeldLock` kept in a list with no task of
/// its own but its renewal.
pub(crate) async fn scale_run(
    guards: usize,
    hold: Duration,
    every: Option<u32>,
    held_locks: bool,
) -> ScaleRun {
    let server = Server::start("mock");
    if let Some(n) = every {
        server
            .control(
                "faults",
                &format!(r#"{{"kind":"status","status":503,"operation":"renew","every":{n}}}"#),
            )
            .await;
    }
    let client = server.client();
    let locks = client.locks();
    let rss_before = rss_kib();
    let started = Instant::now();
    let held = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let until = tokio::time::Instant::now() + hold + Duration::from_secs(10);
    let kept = Arc::new(std::sync::Mutex::new(Vec::with_capacity(guards)));
    let mut tasks = Vec::with_capacity(guards);
    for i in 0..guards {
        let (locks, held, gate) = (locks.clone(), held.clone(), gate.clone());
        if held_locks {
            let kept = kept.clone();
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                let lock = locks
                    .hold(format!("scale-{i}"), Duration::from_secs(15))
                    .await?;
                kept.lock().unwrap().push(lock);
                held.fetch_add(1, Ordering::Relaxed);
                Ok::<_, Error>(())
            }));
            continue;
        }
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await.unwrap();
            locks
                .with_lock(
                    format!("scale-{i}"),
                    Duration::from_secs(15),
                    |_guard| async move {
                        drop(permit);
                        held.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep_until(until).await;
                        Ok::<_, Error>(())
                    },
                )
                .await
        }));
    }
    while held.load(Ordering::Relaxed) < guards && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let acquire_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_held = rss_kib();
    // Count from here: every guard is held and renewing.
    let seq = |r: &serde_json::Value| r["seq"].as_u64().unwrap_or(0);
    let window_start = server.journal().await.last().map_or(0, seq);
    let cpu_start = cpu_seconds("/proc/self/stat");
    let server_cpu_start = server.cpu_seconds();
    let wakeups_start = wakeups();
    tokio::time::sleep(hold).await;
    let client_cpu = cpu_seconds("/proc/self/stat") - cpu_start;
    let server_cpu = server.cpu_seconds() - server_cpu_start;
    let wakeups_per_sec = (wakeups() - wakeups_start) as f64 / hold.as_secs_f64();
    let journal = server.journal().await;
    let renew = |status: u64| {
        journal
            .iter()
            .filter(|r| seq(r) > window_start && r["operation"] == "renew" && r["status"] == status)
            .count()
    };
    let (renewals, renewal_503s) = (renew(200), renew(503));
    let (mut losses, mut other_errors) = (0, 0);
    let mut count = |result: Result<(), Error>| match result {
        Ok(()) => {}
        Err(Error::LockLost(_)) => losses += 1,
        Err(_) => other_errors += 1,
    };
    for task in tasks {
        count(task.await.unwrap());
    }
    let kept = std::mem::take(&mut *kept.lock().unwrap());
    let bare_cpu = match kept.first() {
        // Clean runs only: the injected 503s would answer these too.
        Some(lock) if held_locks && every.is_none() => {
            bare_renewals(&server, &lock.lease(), renewals).await
        }
        _ => 0.0,
    };
    for lock in kept {
        count(lock.release().await);
    }
    let paced = if held_locks && every.is_none() {
        Some(paced_renewals(&server, &client, guards, hold).await)
    } else {
        None
    };
    ScaleRun {
        guards,
        renewals,
        renewal_503s,
        losses,
        other_errors,
        rss_per_guard_kib: rss_held.saturating_sub(rss_before) as f64 / guards as f64,
        client_cpu,
        server_cpu,
        acquire_secs,
        bare_cpu,
        wakeups_per_sec,
        paced,
    }
}

pub(crate) async fn scale() {
    let hold = Duration::from_secs(30);
    let run =
        |every, held_locks| tokio::task::spawn_blocking(move || scale_in_child(every, held_locks));
    let clean = run(0, false).await.unwrap();
    let faulty = run(20, false).await.unwrap();
    let held_clean = run(0, true).await.unwrap();
    let held_faulty = run(20, true).await.unwrap();
    // CPU figures vary from run to run on a shared machine: two more clean
    // runs, and the median ratio.
    let mut cpu_runs = vec![held_clean];
    for _ in 0..2 {
        cpu_runs.push(run(0, true).await.unwrap());
    }
    let row = |name: &str, r: &ScaleRun| {
        format!(
            "| {name} | {} | {:.1} s | {} | {} | {} | {} | {:.1} KiB | {:.1} s | {:.1} s |",
            r.guards,
            r.acquire_secs,
            r.renewals,
            r.renewal_503s,
            r.losses,
            r.other_errors,
            r.rss_per_guard_kib,
            r.client_cpu,
            r.server_cpu
        )
    };
    let mut cpu_rows = Vec::new();
    let mut ratios = Vec::new();
    for (i, r) in cpu_runs.iter().enumerate() {
        let per_renewal = r.client_cpu / r.renewals.max(1) as f64;
        let paced = r
            .paced
            .as_ref()
            .expect("a clean hold run measures a bare loop");
        let paced_per_request = paced.cpu / paced.requests.max(1) as f64;
        let burst_per_request = r.bare_cpu / r.renewals.max(1) as f64;
        ratios.push(per_renewal / paced_per_request);
        cpu_rows.push(format!(
            "| {} | {} | {:.0} µs, {:.0} wake-ups/s | {} | {:.0} µs, {:.0} wake-ups/s | **{:.2}** | {:.0} µs | {:.2} |",
            i + 1,
            r.renewals,
            per_renewal * 1e6,
            r.wakeups_per_sec,
            paced.requests,
            paced_per_request * 1e6,
            paced.wakeups_per_sec,
            per_renewal / paced_per_request,
            burst_per_request * 1e6,
            per_renewal / burst_per_request,
        ));
    }
    let held_clean = &cpu_runs[0];
    let renewals_per_sec = held_clean.renewals as f64 / hold.as_secs_f64();
    report(
        "scale",
        "3. Scale: 10,000 guards on one client",
        &format!(
            "{}\n\nLocks on distinct keys (ttl 15 s) on one `Client`, held for {} s after \
             all were acquired; renewals and CPU are counted over that window. Memory is \
             the client's RSS growth per held lock. `with_lock`: a task per lock whose \
             closure sleeps; `hold`: a `HeldLock` kept in a list (its renewal is its only \
             task).\n\n\
             | run | locks | time to acquire all | renewals | renewal 503s | losses | other errors | RSS per lock | client CPU | server CPU |\n\
             |---|---|---|---|---|---|---|---|---|---|\n{}\n{}\n{}\n{}\n\n\
             Target: 0 losses in every run; at most 4 KiB per held lock.\n\n\
             **CPU per renewal and wake-ups**: `hold` clean, three runs, each beside a \
             bare `reqwest::Client` in the same process right after its window. \
             *Paced*: a loop per lock sending the identical PATCH on the guard's schedule; \
             *back to back*: as many PATCHes, 64 in flight.\n\n\
             | run | renewals | SDK per renewal | paced requests | paced bare per request | ratio | back-to-back bare per request | ratio |\n\
             |---|---|---|---|---|---|---|---|\n{}\n\n\
             Median ratio to the paced loop: **{:.2}** (target ≤ 1.3). A held lock's task \
             sleeps until its next renewal (every ttl/3 ± 10 %): {:.0} renewals a second \
             here, one timer wake-up each, nothing in between. A suspend is noticed by one \
             detector thread per process that looks once a second, not by the locks. \
             Wake-ups are the voluntary context switches of all client threads (the runtime's \
             workers park between bursts of work). The back-to-back figure is what the same \
             requests cost when no worker ever goes idle: the gap to it is the price of the \
             schedule, which a hand-written loop pays too.",
            machine(),
            hold.as_secs(),
            row("with_lock, clean", &clean),
            row("with_lock, 5 % of renewals answered 503", &faulty),
            row("hold, clean", held_clean),
            row("hold, 5 % of renewals answered 503", &held_faulty),
            cpu_rows.join("\n"),
            median(&mut ratios),
            renewals_per_sec,
        ),
    );
}
