//! In-process schedulers on several hosts, the job run at most once per
//! fire: three hosts run the same `tokio-cron-scheduler` job every 10 s,
//! their timers a fraction of a second apart, as real hosts' are.
//!
//! ```sh
//! cargo run --example scheduler            # three hosts, on an in-process mock server
//! cargo run --example scheduler -- min-hold # the other remedy
//! ```
//!
//! A lock released as soon as a two-second job ends lets a host whose
//! timer fires a moment later run the same fire again. The two remedies
//! (see "Schedulers and cron" in docs/guide/jobs.md):
//!
//! - `per-fire` (the default): a key per fire time, `report:<fire>`, kept
//!   by the service for a while after the job (`min_hold`), so a late host
//!   finds that fire's key taken. Each fire stands alone: a slow run does
//!   not hold back the next fire.
//! - `min-hold`: one key, `report`, kept for most of the period after the
//!   job. Runs never overlap; a run longer than the period makes the next
//!   fire skip.
//!
//! With `VOLCANO_API_URL` and `VOLCANO_SERVICE_KEY` set it runs one host
//! against that service: start it on three machines.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tokio_cron_scheduler::{Job, JobScheduler};
use volcano::mock::MockServer;
use volcano::{Client, Error, Locks};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every 10 s, at seconds 0, 10, 20, ... of each minute.
const SCHEDULE: &str = "*/10 * * * * *";
const PERIOD: Duration = Duration::from_secs(10);
/// The lease's ttl while the job runs.
const TTL: Duration = Duration::from_secs(30);

/// How a host keeps a fire from running twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remedy {
    /// A key per fire, kept for `min_hold` after the job.
    PerFire,
    /// One key, kept for most of the period after the job.
    MinHold,
    /// Neither: released as soon as the job ends (what goes wrong).
    None,
}

impl Remedy {
    /// The lock's key for `fire`, and the minimum to keep it.
    fn lock_for(self, job: &str, fire: DateTime<Utc>) -> (String, Option<Duration>) {
        match self {
            // Hosts' timers and clocks differ by well under 8 s here; the
            // key names its fire, so keeping it past the next fire blocks
            // nothing.
            Remedy::PerFire => (
                format!("{job}:{}", fire.format("%Y-%m-%dT%H:%M:%SZ")),
                Some(Duration::from_secs(8)),
            ),
            // Kept until shortly before the next fire: its expiry is
            // rounded up to a second, and the service frees it a second
            // after that.
            Remedy::MinHold => (job.to_owned(), Some(PERIOD - Duration::from_secs(3))),
            Remedy::None => (job.to_owned(), None),
        }
    }
}

/// The fire a timer that went off at `now` belongs to: the schedule's
/// last tick at or before it (a late timer still names its own fire).
fn fire_of(now: DateTime<Utc>) -> DateTime<Utc> {
    let period = TimeDelta::from_std(PERIOD).expect("a small period");
    now.duration_trunc(period).unwrap_or(now)
}

/// What the job did: (fire, host) per run.
type Runs = Arc<Mutex<Vec<(DateTime<Utc>, String)>>>;

/// One host's scheduler: the job every period, its timer `late` after the
/// tick (a host's timer and clock drift), under the lock `remedy` says.
async fn host(
    name: &str,
    job: &'static str,
    locks: Locks,
    remedy: Remedy,
    late: Duration,
    runs: Runs,
) -> Result<JobScheduler, BoxError> {
    let scheduler = JobScheduler::new().await?;
    let name = name.to_owned();
    let job = Job::new_async(SCHEDULE, move |_id, _scheduler| {
        let job_name = job;
        let (locks, runs, name) = (locks.clone(), runs.clone(), name.clone());
        Box::pin(async move {
            tokio::time::sleep(late).await;
            let fire = fire_of(Utc::now());
            let (key, min_hold) = remedy.lock_for(job_name, fire);
            let scope = locks.try_with_lock(&key, TTL, |guard| {
                let (runs, name) = (runs.clone(), name.clone());
                async move {
                    runs.lock().unwrap().push((fire, name.clone()));
                    println!(
                        "{name}: running the report for {fire} (fencing token {})",
                        guard.lease().fencing_token()
                    );
                    // The job: a couple of seconds' work.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, Error>(())
                }
            });
            let scope = match min_hold {
                Some(min) => scope.min_hold(min),
                None => scope,
            };
            match scope.await {
                Ok(Some(())) => {}
                Ok(None) => println!("{name}: {fire} ran elsewhere; skipped"),
                Err(err) => eprintln!("{name}: the report for {fire} failed: {err}"),
            }
        })
    })?;
    scheduler.add(job).await?;
    scheduler.start().await?;
    Ok(scheduler)
}

/// Until `fires` fires have run and the latest is 4 s old (the last host
/// fires 600 ms late, and its try takes a moment), or `fires + 2` periods
/// have passed: a busy machine delays a fire's runs, not their count.
async fn wait_for_fires(runs: &Runs, fires: u32) {
    let give_up = tokio::time::Instant::now() + PERIOD * (fires + 2);
    loop {
        let (seen, latest) = {
            let runs = runs.lock().unwrap();
            let mut times: Vec<_> = runs.iter().map(|(fire, _)| *fire).collect();
            times.sort();
            times.dedup();
            (times.len(), times.last().copied())
        };
        let settled = latest.is_some_and(|fire| Utc::now() - fire >= TimeDelta::seconds(4));
        if (seen >= fires as usize && settled) || tokio::time::Instant::now() >= give_up {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three hosts (a client each, as three processes would have) running
/// `job` for `fires` fires; the runs they made.
async fn three_hosts(
    server: &MockServer,
    job: &'static str,
    remedy: Remedy,
    fires: u32,
) -> Result<Runs, BoxError> {
    let runs: Runs = Arc::default();
    let mut hosts = Vec::new();
    for (i, late) in [0, 250, 600].into_iter().enumerate() {
        let client = Client::for_mock(server);
        let scheduler = host(
            &format!("host-{i}"),
            job,
            client.locks(),
            remedy,
            Duration::from_millis(late),
            runs.clone(),
        )
        .await?;
        hosts.push((client, scheduler));
    }
    wait_for_fires(&runs, fires).await;
    for (client, mut scheduler) in hosts {
        scheduler.shutdown().await?;
        client.shutdown(Duration::from_secs(5)).await;
    }
    Ok(runs)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let remedy = match std::env::args().nth(1).as_deref() {
        Some("min-hold") => Remedy::MinHold,
        Some("none") => Remedy::None,
        _ => Remedy::PerFire,
    };
    if std::env::var_os("VOLCANO_API_URL").is_some()
        || std::env::var_os("VOLCANO_SERVICE_KEY").is_some()
    {
        let client = Client::from_env()?;
        let name = std::env::var("HOSTNAME").unwrap_or_else(|_| "this host".into());
        let _scheduler = host(
            &name,
            "report",
            client.locks(),
            remedy,
            Duration::ZERO,
            Arc::default(),
        )
        .await?;
        println!("{name}: scheduling the report every {PERIOD:?} ({remedy:?}); Ctrl-C stops");
        tokio::signal::ctrl_c().await?;
        client.shutdown(Duration::from_secs(5)).await;
        return Ok(());
    }
    let server = MockServer::start().await;
    println!("Three hosts on an in-process mock lock server, {remedy:?}, for three fires.");
    let runs = three_hosts(&server, "report", remedy, 3).await?;
    let runs = runs.lock().unwrap();
    println!("{} runs over three fires", runs.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Runs per fire.
    fn per_fire(runs: &Runs) -> BTreeMap<DateTime<Utc>, usize> {
        let mut counts = BTreeMap::new();
        for (fire, _) in runs.lock().unwrap().iter() {
            *counts.entry(*fire).or_default() += 1;
        }
        counts
    }

    /// Three schedulers against the mock server, each remedy and neither,
    /// side by side (their keys differ): with either remedy each fire
    /// runs exactly once; without, a late host runs a fire again. Real
    /// time: two fires of 10 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_schedulers_run_each_fire_once() {
        let server = MockServer::start().await;
        let (per_fire_runs, min_hold_runs, unguarded) = tokio::join!(
            three_hosts(&server, "per-fire", Remedy::PerFire, 2),
            three_hosts(&server, "min-hold", Remedy::MinHold, 2),
            three_hosts(&server, "unguarded", Remedy::None, 2),
        );
        for (what, runs) in [
            ("per fire", per_fire_runs.unwrap()),
            ("min_hold", min_hold_runs.unwrap()),
        ] {
            let counts = per_fire(&runs);
            assert!(counts.len() >= 2, "{what}: {counts:?}");
            assert!(counts.values().all(|n| *n == 1), "{what}: {counts:?}");
        }
        let counts = per_fire(&unguarded.unwrap());
        assert!(
            counts.values().any(|n| *n > 1),
            "without a remedy a late host runs a fire again: {counts:?}"
        );
    }
}
