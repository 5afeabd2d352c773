//! A cron job for a fleet: the same crontab line on five hosts, and the
//! report runs once per period.
//!
//! ```text
//! # /etc/cron.d/nightly-report on each of the five hosts
//! */5 * * * * app /usr/local/bin/nightly-report
//! ```
//!
//! Every host fires at about the same moment, but their clocks and cron
//! daemons differ by up to a few seconds. The first to take the lock runs
//! the report; `min_hold` keeps the key with the service for 60 s after it
//! was acquired (the process may exit at once), so a host firing a few
//! seconds late finds it held and skips. The next period is 5 minutes
//! away, far beyond the minimum (keep `min_hold` under the period minus
//! 3 s). The job's writes carry the fencing token, for the case no lock can
//! cover: a process paused past its lease.
//!
//! ```sh
//! cargo run --example cron        # five hosts in one process, on the in-process mock server
//! ```
//!
//! With `VOLCANO_API_URL` or `VOLCANO_SERVICE_KEY` set, it is one host
//! against that service: it runs or skips once, then exits with 0 (ran or
//! skipped) or 1 (failed), as cron expects.
//!
//! In your program, `fire` and `one_host` are the whole job (with `volcano`
//! and `tokio`'s `macros` and `rt-multi-thread` as dependencies); the
//! five-host demo in `main` uses the `mock` feature, which belongs under
//! `[dev-dependencies]`. A host killed mid-report leaves the key taken
//! until its ttl (60 s) ends, and the next period runs as usual; what the
//! report had written stays written, so make its writes safe to repeat or
//! fence them.

use std::process::ExitCode;
use std::time::Duration;

use volcano::mock::MockServer;
use volcano::{Client, LockGuard};

/// The lock's key: one per job, the same on every host.
const KEY: &str = "nightly-report";
/// How long the lease lasts if this process dies: the next period can run
/// this much after a crash.
const TTL: Duration = Duration::from_secs(60);
/// The largest difference between hosts' firing times, with room to spare.
const MIN_HOLD: Duration = Duration::from_secs(60);

/// The job's error: the lock's failures arrive in it through `From`.
#[derive(Debug)]
enum JobError {
    Lock(volcano::Error),
    Lost,
}

impl From<volcano::Error> for JobError {
    fn from(err: volcano::Error) -> Self {
        JobError::Lock(err)
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Lock(err) => write!(f, "{err}"),
            JobError::Lost => f.write_str("the lock was lost; the report stopped"),
        }
    }
}

/// The report: a few steps, each checked against the guard and written
/// with the fencing token (a store of yours rejects older tokens).
async fn nightly_report(host: &str, guard: LockGuard) -> Result<u32, JobError> {
    let fence = guard.lease().fencing_token();
    let mut rows = 0;
    for _step in 0..3 {
        if guard.is_lost() {
            return Err(JobError::Lost);
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // the work
        rows += 100;
    }
    println!("  {host}: wrote {rows} rows with fencing token {fence}");
    Ok(rows)
}

/// One firing on one host: runs the report or skips it.
async fn fire(client: &Client, host: &str) -> Result<Option<u32>, JobError> {
    client
        .locks()
        .try_with_lock(KEY, TTL, |guard| nightly_report(host, guard))
        .min_hold(MIN_HOLD)
        .await
}

/// What a host's cron sees: one line, and success (ran or skipped) or
/// failure for the exit code.
async fn one_host(client: &Client, host: &str) -> bool {
    let ok = match fire(client, host).await {
        Ok(Some(rows)) => {
            println!("{host}: ran the report ({rows} rows)");
            true
        }
        Ok(None) => {
            println!("{host}: another host runs this period's report; skipped");
            true
        }
        Err(err) => {
            eprintln!("{host}: the report failed: {err}");
            false
        }
    };
    // A kept minimum needs nothing from this process; a release still
    // owed (a failure, say) is waited for, so the next period finds the
    // key free rather than waiting out the ttl.
    let unfinished = client.shutdown(Duration::from_secs(5)).await;
    if !unfinished.is_empty() {
        eprintln!("{host}: may still hold {unfinished:?} until its ttl");
    }
    ok
}

fn exit_code(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    if configured() {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "this host".to_owned());
        return Ok(exit_code(one_host(&Client::from_env()?, &host).await));
    }

    // Five hosts, each its own process in real life (here: its own client),
    // firing 0 to 3 s apart as unsynchronised cron daemons do.
    let server = MockServer::start().await;
    println!("(in-process mock lock server at {})", server.url());
    let mut hosts = tokio::task::JoinSet::new();
    for (n, late_ms) in [0u64, 400, 1_100, 2_000, 3_000].into_iter().enumerate() {
        let client = Client::for_mock(&server);
        hosts.spawn(async move {
            tokio::time::sleep(Duration::from_millis(late_ms)).await;
            one_host(&client, &format!("host-{}", n + 1)).await
        });
    }
    let mut failed = 0;
    while let Some(ok) = hosts.join_next().await {
        if !ok? {
            failed += 1;
        }
    }
    let runs = server
        .requests()
        .iter()
        .filter(|r| r.operation == volcano::mock::Operation::Acquire && r.status == Some(201))
        .count();
    println!("\n{runs} of 5 hosts ran the report; the key is kept until 60 s after it was taken.");
    Ok(exit_code(failed == 0 && runs == 1))
}

/// Whether the environment names a lock service: `VOLCANO_API_URL` or
/// `VOLCANO_SERVICE_KEY` set. Only when neither is does this example run on
/// an in-process mock server. (In your app, keep the SDK's `mock` feature
/// under `[dev-dependencies]`: a mock is for tests.)
fn configured() -> bool {
    [volcano::ENV_API_URL, volcano::ENV_SERVICE_KEY]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
