//! `cargo run --release -- --seeds N`, from sim/, explores seeds;
//! `--seed S --trace FILE` replays one and writes its event trace (built
//! elsewhere, without sim/.cargo/config.toml's `--cfg tokio_unstable`, a
//! seed's trace may differ between runs: it says so on standard error). The last
//! line is `sim: N seeds, V violations, F faults, E events`; the exit
//! status is 1 when a check failed, after each failing seed and the
//! command that replays it.

use std::io::IsTerminal;
use std::process::ExitCode;

use volcano_sim::{run, Depth, Options, Sabotage};

struct Args {
    first: u64,
    seeds: u64,
    trace: Option<String>,
    /// Print a line per seed with a hash of its trace.
    each: bool,
    options: Options,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        first: 0,
        seeds: 100,
        trace: None,
        each: false,
        options: Options::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v:?}: {e}"));
        match flag.as_str() {
            "--seeds" => args.seeds = number(value()?)?,
            "--from" => args.first = number(value()?)?,
            "--seed" => {
                args.first = number(value()?)?;
                args.seeds = 1;
            }
            "--trace" => args.trace = Some(value()?),
            "--each" => args.each = true,
            "--log" => {
                // The SDK's own logs, for a replay: stderr, no timestamps
                // (simulated time is in the trace).
                tracing_subscriber::fmt()
                    .with_writer(std::io::stderr)
                    .without_time()
                    .with_env_filter(
                        std::env::var("RUST_LOG").unwrap_or_else(|_| "volcano=debug".to_owned()),
                    )
                    .init();
            }
            "--clients" => args.options.clients = number(value()?)? as usize,
            "--keys" => args.options.keys = number(value()?)?.max(1) as usize,
            "--steps" => args.options.steps = number(value()?)? as usize,
            "--kept-minimums" => args.options.depth = Depth::KeptMinimums,
            "--observers" => args.options.depth = Depth::Observers,
            "--permits" => args.options.depth = Depth::Permits,
            "--clock-rate" => {
                let rate: f64 = value()?.parse().map_err(|e| format!("--clock-rate: {e}"))?;
                args.options.clock_rate = Some(rate);
            }
            "--sabotage" => {
                args.options.sabotage = match value()?.as_str() {
                    "release-before-mark" => Sabotage::ReleaseBeforeMark,
                    "no-undo" => Sabotage::NoUndo,
                    "undo-ends-at-first-release" => Sabotage::UndoEndsAtFirstRelease,
                    "retry-settles-all" => Sabotage::RetrySettlesAll,
                    "deadline-from-receipt" => Sabotage::DeadlineFromReceipt,
                    "try-after-deadline" => Sabotage::TryAfterDeadline,
                    "drop-refused-release" => Sabotage::DropRefusedRelease,
                    "no-ramp" => Sabotage::NoRamp,
                    "no-risk-warning" => Sabotage::NoRiskWarning,
                    "no-min-hold" => Sabotage::NoMinHold,
                    "min-hold-in-process" => Sabotage::MinHoldInProcess,
                    "no-drain" => Sabotage::NoDrain,
                    "semaphore-extra-permit" => Sabotage::SemaphoreExtraPermit,
                    "stale-leader-status" => Sabotage::StaleLeaderStatus,
                    "observe-misses-takeover" => Sabotage::ObserveMissesTakeover,
                    "observe-stalls" => Sabotage::ObserveStalls,
                    "leader-health-silent" => Sabotage::LeaderHealthSilent,
                    "leader-health-stuck" => Sabotage::LeaderHealthStuck,
                    "no-renewal" => Sabotage::NoRenewal,
                    "retry-on-409" => Sabotage::RetryOn409,
                    "waiter-stops-trying" => Sabotage::WaiterStopsTrying,
                    "waiter-spins" => Sabotage::WaiterSpins,
                    "waiter-gives-up-on-error" => Sabotage::WaiterGivesUpOnError,
                    "renews-in-a-tight-loop" => Sabotage::RenewsInATightLoop,
                    "renews-too-late" => Sabotage::RenewsTooLate,
                    "renewal-retries-conflict" => Sabotage::RenewalRetriesConflict,
                    "renews-once" => Sabotage::RenewsOnce,
                    "risk-never-clears" => Sabotage::RiskNeverClears,
                    "late-renewal-forgotten" => Sabotage::LateRenewalForgotten,
                    "semaphore-try-gives-up-early" => Sabotage::SemaphoreTryGivesUpEarly,
                    "kept-sweep-releases" => Sabotage::KeptSweepReleases,
                    "keep-past-max-hold" => Sabotage::KeepPastMaxHold,
                    "follower-waits-for-undo" => Sabotage::FollowerWaitsForUndo,
                    "semaphore-tries-recent-first" => Sabotage::SemaphoreTriesRecentFirst,
                    "kept-reported-not-kept" => Sabotage::KeptReportedNotKept,
                    other => return Err(format!("unknown sabotage {other:?}")),
                }
            }
            "-h" | "--help" => {
                return Err(
                    "usage: volcano-sim [--seeds N] [--from S] [--seed S --trace FILE] \
                            [--clients N] [--keys N] [--steps N] [--clock-rate R] \
                            [--kept-minimums | --observers | --permits] [--sabotage NAME] [--each]"
                        .to_owned(),
                )
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if args.options.clients == 0 {
        return Err("--clients must be at least 1".to_owned());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(args.seeds);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} seeds, {per_sec}, {msg} [{elapsed_precise} / {eta}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    #[cfg(not(tokio_unstable))]
    eprintln!(
        "sim: built without --cfg tokio_unstable, so a seed may not replay exactly; build from sim/"
    );
    let started = std::time::Instant::now();
    let (mut violations, mut faults, mut events, mut failed) = (0, 0, 0, Vec::new());
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    let mut margins = Vec::new();
    let (mut beyond_bound, mut after_a_409) = (0, 0);
    for seed in args.first..args.first.saturating_add(args.seeds) {
        let outcome = run(seed, &args.options);
        if args.each {
            println!(
                "seed {seed}: {} faults, {} events, trace {:016x}",
                outcome.faults,
                outcome.events,
                fnv1a(outcome.trace.as_bytes())
            );
        }
        violations += outcome.violations.len();
        faults += outcome.faults;
        for (kind, n) in &outcome.fault_kinds {
            *kinds.entry(kind.clone()).or_default() += n;
        }
        events += outcome.events;
        margins.extend_from_slice(&outcome.margins_ms);
        beyond_bound += outcome.late_beyond_bound;
        after_a_409 += outcome.granted_after_a_409;
        if let Some(path) = &args.trace {
            if let Err(err) = std::fs::write(path, &outcome.trace) {
                eprintln!("could not write {path}: {err}");
                return ExitCode::from(2);
            }
        }
        if !outcome.violations.is_empty() {
            let report = |line: &str| match &bar {
                Some(bar) => bar.println(line),
                None => eprintln!("{line}"),
            };
            for v in &outcome.violations {
                report(&format!("seed {seed}: {v}"));
            }
            report(&format!(
                "  replay: cargo run --release -- --seed {seed} --trace sim-{seed}.log (from sim/)"
            ));
            failed.push(seed);
        }
        if let Some(bar) = &bar {
            bar.set_message(format!("{violations} violations"));
            bar.inc(1);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{:.1} seeds/s over {secs:.1} s; failing seeds: {failed:?}",
        args.seeds as f64 / secs.max(1e-9)
    );
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    eprintln!("faults by kind: {}", kinds.join(", "));
    eprintln!("{}", margin_line(&mut margins));
    eprintln!(
        "late tries beyond the bound (sent + timeout + 2 s), excused: {beyond_bound}; \
         unseen grants after a 409 to their acquire: {after_a_409}"
    );
    println!(
        "sim: {} seeds, {violations} violations, {faults} faults, {events} events",
        args.seeds
    );
    if violations > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The belief margin's distribution: for every loss a guard found itself,
/// how long before the server's expiry it said so.
fn margin_line(margins: &mut [i64]) -> String {
    margins.sort_unstable();
    let at = |q: f64| {
        let i = ((margins.len() - 1) as f64 * q).round() as usize;
        format!("{:.2} s", margins[i] as f64 / 1000.0)
    };
    if margins.is_empty() {
        return "belief margin: no loss".to_owned();
    }
    format!(
        "belief margin over {} losses: p0 {}, p10 {}, p50 {}, p90 {}",
        margins.len(),
        at(0.0),
        at(0.1),
        at(0.5),
        at(0.9)
    )
}

/// FNV-1a, 64 bits: a stable fingerprint of a trace (the same bytes give
/// the same hash on every machine and build).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
