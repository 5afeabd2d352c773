//! The seeded schedule of faults: pauses past the ttl, kills, stops,
//! partitions, answers held after the service applied them, and 503 and
//! 429 storms.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustix::process::Signal;

use crate::db;
use crate::now_ms;
use crate::processes::{family, lock, signal, signal_family, Shared};
use crate::proxy::{Mode, Proxy};

/// How long a kill followed by quiet is preceded by quiet too.
const QUIET_BEFORE_KILL: Duration = Duration::from_millis(1_500);

/// Counts of what the schedule did.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub(crate) secs: f64,
    pub(crate) by_kind: BTreeMap<&'static str, usize>,
    pub(crate) long_pauses: usize,
    /// Kills followed by a stretch with no fault at all (the ttl, the
    /// service's grace and the takeover bound), so that the takeover
    /// bound has cases to judge.
    pub(crate) quiet_after_kills: usize,
    pub(crate) on: Vec<(i64, i64)>,
    pub(crate) pauses: Vec<(i64, i64)>,
}

/// The seeded schedule: a fault every 0.5 to 1.5 s until `secs` have
/// passed. The kinds and their parameters come from the seed; which
/// process a signal reaches depends on which are running then.
pub(crate) async fn schedule(
    seed: u64,
    until: &Until<'_>,
    ttl: u64,
    proxy: &Proxy,
    mock: &str,
    shared: &Shared,
) -> Faults {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut faults = Faults::default();
    let began = tokio::time::Instant::now();
    let mut paused: Vec<(Vec<u32>, tokio::time::Instant)> = Vec::new();
    let mut checked = began;
    // The first kill, and every other one after it, is followed by quiet.
    let mut quiet_next_kill = true;
    loop {
        let ran = began.elapsed();
        if ran >= until.longest() {
            break;
        }
        if let Until::Lost { min, db, .. } = until {
            // The control goes on until it has lost an update (or its
            // longest time): the faults must be seen to bite.
            if ran >= *min && checked.elapsed() >= Duration::from_secs(3) {
                checked = tokio::time::Instant::now();
                if db::lost_so_far(db.0, db.1).await.unwrap_or(0) > 0 {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
        let now = tokio::time::Instant::now();
        paused.retain(|(pids, until)| {
            let over = *until <= now;
            if over {
                for pid in pids {
                    signal(*pid, Signal::CONT);
                }
            }
            !over
        });
        let mut roll = rng.random_range(0..100);
        // A run 8 s in without a kill kills now (followed by quiet, a
        // holder as soon as one holds): the takeover bound must have a
        // case to judge in every run.
        if ran >= Duration::from_secs(8) && faults.quiet_after_kills == 0 {
            roll = 50;
        }
        let pick = rng.random_range(0..1000usize);
        // A kill followed by quiet picks a library worker (a `locks run`
        // says nothing the takeover bound could judge).
        let quiet_kill = quiet_next_kill && (50..58).contains(&roll);
        if quiet_kill {
            // Quiet from before the kill on: every paused process goes on
            // now (its pause ends here, not as planned), and no fault for
            // a moment, so that a lease that expires within a second of
            // the kill has its takeover window clear of the faults before.
            // The holder is picked after that moment.
            let now = now_ms();
            for (pids, _) in paused.drain(..) {
                for pid in pids {
                    signal(pid, Signal::CONT);
                }
            }
            for pause in &mut faults.pauses {
                pause.1 = pause.1.min(now);
            }
            tokio::time::sleep(QUIET_BEFORE_KILL).await;
        }
        let now = tokio::time::Instant::now();
        let target = {
            let p = lock(shared);
            // Not one that is paused already.
            let live: Vec<(String, u32)> = p
                .live
                .iter()
                .filter(|(_, pid)| !paused.iter().any(|(p, _)| p.contains(*pid)))
                .map(|(n, pid)| (n.clone(), *pid))
                .collect();
            // Signals go to a holder when there is one, at the worst
            // moment: a library worker that has just read a counter it is
            // about to write back (its last word `read`) or holds a lock
            // (`held`); one time in four, a `locks run` (holding or
            // waiting: it does not say) may be picked too.
            let with_cli = pick % 4 == 0 && !quiet_kill;
            let last = |name: &String| {
                p.said
                    .get(name)
                    .and_then(|l| l.last())
                    .map(|l| l["event"].clone())
            };
            let holding: Vec<(String, u32)> = live
                .iter()
                .filter(|(name, _)| {
                    (with_cli && name.starts_with("cli"))
                        || last(name).is_some_and(|e| e == "read" || e == "held")
                })
                .cloned()
                .collect();
            // A kill followed by quiet is for a holder: with none now it
            // waits for the next round (it is made before any other
            // fault).
            if quiet_kill && holding.is_empty() {
                drop(p);
                continue;
            }
            let among = if holding.is_empty() { &live } else { &holding };
            (!among.is_empty()).then(|| among[pick % among.len()].clone())
        };
        let lasting = Duration::from_millis(rng.random_range(500..2500));
        let start = now_ms();
        let kind = match (roll, &target) {
            (0..50, Some((name, pid))) => {
                if std::env::var_os("E2E_TRACE").is_some() {
                    eprintln!("{} pausing {name}", now_ms());
                }
                let pause =
                    Duration::from_millis(rng.random_range(ttl * 1200 + 1000..ttl * 2000 + 2000));
                // A host pause: a `locks run` stops with its command.
                let pids = family(*pid);
                for member in &pids {
                    signal(*member, Signal::STOP);
                }
                paused.push((pids, now + pause));
                faults.long_pauses += 1;
                faults
                    .pauses
                    .push((start, start + pause.as_millis() as i64));
                "pause past the ttl (SIGSTOP, SIGCONT)"
            }
            (50..58, Some((name, pid))) => {
                let quiet = quiet_next_kill;
                quiet_next_kill = !quiet;
                lock(shared).killed.insert(name.clone(), start);
                signal_family(*pid, Signal::KILL);
                if quiet {
                    // No fault until the killed holder's lease has run
                    // out (a ttl), the service's grace (1 s) and the
                    // takeover bound (4 s) have passed, and a second more.
                    tokio::time::sleep(Duration::from_secs(ttl + 6)).await;
                    faults.quiet_after_kills += 1;
                }
                "kill (SIGKILL)"
            }
            (58..64, Some((_, pid))) => {
                signal(*pid, Signal::TERM);
                "stop (SIGTERM)"
            }
            (64..70, _) => {
                network(proxy, Mode::Partition, lasting, &mut faults.on).await;
                "partition"
            }
            (70..78, _) => {
                let held = Duration::from_millis(rng.random_range(200..1500));
                network(proxy, Mode::Hold(held), lasting, &mut faults.on).await;
                "answers held after the service applied, then cut"
            }
            (78..84, _) => {
                let delay = Duration::from_millis(rng.random_range(50..400));
                network(proxy, Mode::Delay(delay), lasting, &mut faults.on).await;
                "delays"
            }
            (84..89, _) => {
                network(proxy, Mode::Reset, lasting, &mut faults.on).await;
                "resets after the request"
            }
            (89..95, _) => {
                storm(&http, mock, 503, lasting, &mut faults.on).await;
                "503 storm"
            }
            _ => {
                storm(&http, mock, 429, lasting, &mut faults.on).await;
                "429 storm"
            }
        };
        *faults.by_kind.entry(kind).or_default() += 1;
    }
    for (pids, _) in paused {
        for pid in pids {
            signal(pid, Signal::CONT);
        }
    }
    faults.secs = began.elapsed().as_secs_f64();
    faults
}

/// How long the schedule runs.
pub(crate) enum Until<'a> {
    /// This long.
    Secs(Duration),
    /// At least `min`, then until the run's database (URL, name) has lost
    /// an update, at most `max`.
    Lost {
        min: Duration,
        max: Duration,
        db: (&'a str, &'a str),
    },
}

impl Until<'_> {
    pub(crate) fn longest(&self) -> Duration {
        match self {
            Until::Secs(d) => *d,
            Until::Lost { max, .. } => *max,
        }
    }
}

pub(crate) async fn network(
    proxy: &Proxy,
    mode: Mode,
    lasting: Duration,
    on: &mut Vec<(i64, i64)>,
) {
    let start = now_ms();
    proxy.set(mode);
    tokio::time::sleep(lasting).await;
    proxy.set(Mode::Pass);
    on.push((start, now_ms()));
}

pub(crate) async fn storm(
    http: &reqwest::Client,
    mock: &str,
    status: u16,
    lasting: Duration,
    on: &mut Vec<(i64, i64)>,
) {
    let start = now_ms();
    let fault = serde_json::json!({"kind": "status", "status": status});
    let _ = http
        .post(format!("{mock}/__mock/faults"))
        .json(&fault)
        .send()
        .await;
    tokio::time::sleep(lasting).await;
    let _ = http.delete(format!("{mock}/__mock/faults")).send().await;
    on.push((start, now_ms()));
}
