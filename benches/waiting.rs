//! Waiting and renewing against the project's quota, in real time, on the
//! mock server with the service's quota (`rate_limit(600)`): both sides of
//! each trade-off are printed.
//!
//! ```sh
//! cargo bench -p volcano --bench waiting -- pickup    # release -> held, 0.5/2/10/60 s into a wait (~80 s)
//! cargo bench -p volcano --bench waiting -- long      # requests per waiter-minute over 10 minutes (~10 min)
//! cargo bench -p volcano --bench waiting -- fleets    # 16 waiters on 1 key, 4 keys x 8, per minute (~3 min)
//! cargo bench -p volcano --bench waiting -- renewals  # renewals per held lock-minute, ttl 15/30/60 s (~2 min)
//! cargo bench -p volcano --bench waiting              # all but long
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use volcano::{Client, Error};
use volcano_mock_server::{MockServer, Operation, RecordedRequest};

const QUOTA: u32 = 600;
const HOLDER_RID: &str = "11111111-2222-4333-8444-555555555555";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let which = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "all".to_owned());
    let all = which == "all";
    if all || which == "pickup" {
        pickup().await;
    }
    if which == "long" {
        long().await;
    }
    if all || which == "fleets" {
        fleets().await;
    }
    if all || which == "renewals" {
        renewals().await;
    }
}

fn client(server: &MockServer) -> Client {
    Client::builder()
        .service_key(server.service_key())
        .api_url(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a mock client")
}

/// The waiter's requests: its tries (not the holder's acquire) and looks.
fn waiter_requests(journal: &[RecordedRequest]) -> usize {
    journal
        .iter()
        .filter(|r| match r.operation {
            Operation::Acquire => r.request_id.as_deref() != Some(HOLDER_RID),
            Operation::Get => true,
            _ => false,
        })
        .count()
}

/// A server with the service's quota, and "job" held there (ttl 60 s,
/// renewing) by a client of its own.
async fn held_elsewhere() -> (MockServer, volcano::HeldLock) {
    let server = MockServer::builder().rate_limit(QUOTA).start().await;
    let held = client(&server)
        .locks()
        .hold("job", Duration::from_secs(60))
        .request_id(HOLDER_RID)
        .await
        .expect("the holder acquires");
    (server, held)
}

/// One trial: a holder (ttl 60 s, renewing) releases gracefully `into`
/// after the waiter began; how long until the waiter held the lock, and
/// how many requests the waiter sent.
async fn trial(into: Duration) -> (Duration, usize) {
    let (server, held) = held_elsewhere().await;
    let waiter = client(&server);
    let waiting = tokio::spawn(async move {
        let lease = waiter
            .locks()
            .acquire("job", Duration::from_secs(30))
            .wait(Duration::from_secs(600))
            .await;
        (Instant::now(), lease)
    });
    tokio::time::sleep(into).await;
    held.release().await.expect("a graceful release");
    let released = Instant::now();
    let (held_at, lease) = waiting.await.expect("the waiter ran");
    lease.expect("the waiter got the lock");
    let requests = waiter_requests(&server.requests());
    (held_at.saturating_duration_since(released), requests)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn pickup() {
    const TRIALS: usize = 20;
    let offsets = [0.5, 2.0, 10.0, 60.0].map(Duration::from_secs_f64);
    let mut runs = Vec::new();
    for &into in &offsets {
        for _ in 0..TRIALS {
            runs.push((into, tokio::spawn(trial(into))));
        }
    }
    let mut results: Vec<(Duration, Vec<Duration>, Vec<usize>)> = offsets
        .iter()
        .map(|&o| (o, Vec::new(), Vec::new()))
        .collect();
    for (into, run) in runs {
        let (delay, requests) = run.await.expect("a trial");
        let row = results.iter_mut().find(|r| r.0 == into).expect("a row");
        row.1.push(delay);
        row.2.push(requests);
    }
    println!("## release -> held ({TRIALS} trials each; holder ttl 60 s; defaults)\n");
    println!("| wait began before the release | p50 | p95 | max | goal (p95) | waiter's requests (median) |");
    println!("|---|---|---|---|---|---|");
    for (into, mut delays, mut requests) in results {
        delays.sort();
        requests.sort();
        let goal = (into.mul_f64(0.3))
            .max(Duration::from_millis(300))
            .min(Duration::from_secs(10));
        println!(
            "| {:.1} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {} |",
            into.as_secs_f64(),
            percentile(&delays, 0.5).as_secs_f64(),
            percentile(&delays, 0.95).as_secs_f64(),
            delays.last().copied().unwrap_or_default().as_secs_f64(),
            goal.as_secs_f64(),
            requests[requests.len() / 2],
        );
    }
    println!();
    // The ramp is nearly deterministic: at a fixed offset every trial has
    // about the same phase. Releases spread over the first minute show
    // the whole distribution.
    let spread: Vec<Duration> = (0..40)
        .map(|i| Duration::from_secs_f64(0.5 + 59.5 * f64::from(i) / 39.0))
        .collect();
    let runs: Vec<_> = spread
        .iter()
        .map(|&into| tokio::spawn(trial(into)))
        .collect();
    let mut shares = Vec::new();
    for (into, run) in spread.iter().zip(runs) {
        let (delay, _) = run.await.expect("a trial");
        let bound = into
            .mul_f64(0.3)
            .max(Duration::from_millis(300))
            .min(Duration::from_secs(10));
        shares.push(delay.as_secs_f64() / bound.as_secs_f64());
    }
    shares.sort_by(f64::total_cmp);
    let at = |p: f64| shares[((shares.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "Releases spread over 0.5-60 s into the wait (40): release -> held as a share of the \
         bound max(0.3 s, 30 % of the time waited) capped at 10 s: p50 {:.2}, p95 {:.2}, max {:.2}\n",
        at(0.5),
        at(0.95),
        at(1.0)
    );
}

/// Waiters behind a holder that never lets go, for `minutes`: the
/// requests each sends per minute, minute by minute.
async fn per_minute_of_waiting(waiters: usize, minutes: u64) -> Vec<f64> {
    let (server, held) = held_elsewhere().await;
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let waiter = client(&server);
        tasks.push(tokio::spawn(async move {
            let _ = waiter
                .locks()
                .acquire("job", Duration::from_secs(30))
                .wait(Duration::from_secs(minutes * 60))
                .await;
        }));
    }
    let started = chrono::Utc::now();
    for task in tasks {
        let _ = task.await;
    }
    let journal = server.requests();
    drop(held);
    (0..minutes)
        .map(|m| {
            let from = started + chrono::TimeDelta::seconds(60 * m as i64);
            let to = from + chrono::TimeDelta::seconds(60);
            let in_minute: Vec<RecordedRequest> = journal
                .iter()
                .filter(|r| r.at >= from && r.at < to)
                .cloned()
                .collect();
            waiter_requests(&in_minute) as f64 / waiters as f64
        })
        .collect()
}

async fn long() {
    let minutes = per_minute_of_waiting(4, 10).await;
    println!("## requests per waiter-minute (4 waiters, holder ttl 60 s, defaults)\n");
    println!("| minute | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 | over 10 |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let cells: Vec<String> = minutes.iter().map(|m| format!("{m:.1}")).collect();
    let mean = minutes.iter().sum::<f64>() / minutes.len() as f64;
    println!("| requests | {} | {mean:.1} |\n", cells.join(" | "));
}

/// Requests in each minute since `started` (the first included), as a
/// share of the quota, and 429s.
fn minutes_of(
    journal: &[RecordedRequest],
    started: chrono::DateTime<chrono::Utc>,
    n: i64,
) -> Vec<(f64, usize)> {
    (0..n)
        .map(|m| {
            let from = started + chrono::TimeDelta::seconds(60 * m);
            let to = from + chrono::TimeDelta::seconds(60);
            let in_minute = journal.iter().filter(|r| r.at >= from && r.at < to);
            let (mut count, mut refused) = (0, 0);
            for r in in_minute {
                count += 1;
                refused += usize::from(r.status == Some(429));
            }
            (count as f64 / f64::from(QUOTA), refused)
        })
        .collect()
}

/// `keys` × `per_key` workers on one project, starting together: each
/// holds its key (ttl 15 s) when it can, for longer than the run, or
/// waits for it (`leader`: leader campaigns, else waits with a deadline).
async fn fleet(keys: usize, per_key: usize, leader: bool, secs: u64) -> (Vec<(f64, usize)>, usize) {
    let server = MockServer::builder().rate_limit(QUOTA).start().await;
    let terms = Arc::new(Mutex::new(0usize));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let started = chrono::Utc::now();
    let mut workers = Vec::new();
    for k in 0..keys {
        for _ in 0..per_key {
            let key = format!("fleet-{k}");
            let (locks, terms, stop) = (client(&server).locks(), terms.clone(), stop_rx.clone());
            workers.push(tokio::spawn(async move {
                let ttl = Duration::from_secs(15);
                if leader {
                    let _ = locks
                        .leader(key, ttl)
                        .until(stopped(stop))
                        .run(move |_term| {
                            *terms.lock().unwrap() += 1;
                            std::future::pending::<Result<(), Error>>()
                        })
                        .await;
                } else {
                    let hold = locks.hold(key, ttl).wait(Duration::from_secs(3600));
                    tokio::select! {
                        held = hold => {
                            if held.is_ok() {
                                *terms.lock().unwrap() += 1;
                            }
                            stopped(stop).await;
                            drop(held);
                        }
                        () = stopped(stop.clone()) => {}
                    }
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let journal = server.requests();
    stop_tx.send(true).unwrap();
    for worker in workers {
        let _ = worker.await;
    }
    let terms = *terms.lock().unwrap();
    (minutes_of(&journal, started, (secs / 60) as i64), terms)
}

async fn fleets() {
    const SECS: u64 = 180;
    println!("## fleets starting together (ttl 15 s, defaults), share of the quota per minute\n");
    println!("| fleet | minute 1 | minute 2 | minute 3 | 429s | terms (leader changes) |");
    println!("|---|---|---|---|---|---|");
    let runs = [
        ("16 leader candidates, 1 key", 1, 16, true),
        ("8 leader candidates on each of 4 keys", 4, 8, true),
        ("16 waiters with a deadline, 1 key", 1, 16, false),
        ("8 waiters with a deadline on each of 4 keys", 4, 8, false),
    ];
    let results = futures_join(
        runs.iter()
            .map(|&(_, keys, per_key, leader)| fleet(keys, per_key, leader, SECS)),
    )
    .await;
    for ((name, keys, ..), (minutes, terms)) in runs.iter().zip(results) {
        let shares: Vec<String> = minutes
            .iter()
            .map(|(s, _)| format!("{:.0} %", s * 100.0))
            .collect();
        let refused: usize = minutes.iter().map(|(_, r)| r).sum();
        println!(
            "| {name} | {} | {refused} | {terms} ({}) |",
            shares.join(" | "),
            terms.saturating_sub(*keys)
        );
    }
    println!();
}

async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.expect("a fleet"));
    }
    out
}

/// Renewals per lock-minute of 8 locks held with `ttl` for `secs`.
async fn renewal_rate(ttl: u64, secs: u64) -> f64 {
    let server = MockServer::start().await;
    let locks = client(&server).locks();
    let mut held = Vec::new();
    for i in 0..8 {
        held.push(
            locks
                .hold(format!("k{i}"), Duration::from_secs(ttl))
                .await
                .expect("held"),
        );
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let renewals = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Renew)
        .count() as f64;
    renewals / held.len() as f64 / (secs as f64 / 60.0)
}

async fn renewals() {
    const SECS: u64 = 120;
    let ttls = [15, 30, 60];
    let rates = futures_join(ttls.iter().map(|&ttl| renewal_rate(ttl, SECS))).await;
    println!("## renewals per held lock-minute (8 locks each, {SECS} s)\n");
    println!("| ttl | renewals per lock-minute | locks a 600/min quota sustains |");
    println!("|---|---|---|");
    for (ttl, per_minute) in ttls.iter().zip(rates) {
        println!(
            "| {ttl} s | {per_minute:.2} | {:.0} |",
            f64::from(QUOTA) / per_minute
        );
    }
    println!();
}
