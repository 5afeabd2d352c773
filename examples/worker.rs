//! A periodic job under `try_with_lock`: two workers tick every second; whoever
//! holds the lock runs the job, writing in chunks to a store that checks
//! fencing tokens, and stops as soon as its guard says the lock is lost.
//!
//! ```sh
//! cargo run --example worker            # in-process mock server, 5 ticks
//! WORKER_TICKS=20 cargo run --example worker
//! ```
//!
//! With `VOLCANO_API_URL`, `VOLCANO_SERVICE_KEY` and `VOLCANO_ANON_KEY` set it
//! uses that server (lock key `volcano-example-worker`).
//!
//! Ctrl-C or SIGTERM stops the workers mid-job; before exiting, `main` waits
//! (at most 5 s) for the releases of the cancelled jobs with
//! `client.shutdown`, so the next worker does not wait out the ttl.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use volcano::mock::MockServer;
use volcano::{Client, Error, LockGuard};
use volcano_fence::Gate;

/// The job's output, behind a fence gate (`volcano_fence::Gate`): a
/// chunk carrying a fencing token older than the newest accepted one is
/// refused, and the check and the append are one step.
#[derive(Default)]
struct FencedStore {
    gate: Gate,
    lines: Mutex<Vec<String>>,
}

impl FencedStore {
    fn append(&self, fence: i64, line: String) -> Result<(), String> {
        self.gate
            .write("report", fence, || self.lines.lock().unwrap().push(line))
            .map_err(|stale| stale.to_string())
    }
}

#[derive(Debug)]
enum JobError {
    Lock(Error),
    Store(String),
}

impl From<Error> for JobError {
    fn from(err: Error) -> Self {
        JobError::Lock(err)
    }
}

/// The protected job: five chunks, each written with the current fence.
async fn nightly_report(
    name: &str,
    guard: LockGuard,
    store: &FencedStore,
) -> Result<u32, JobError> {
    let mut written = 0;
    for chunk in 1..=5 {
        if guard.is_lost() {
            println!("  {name}: lost the lock; stopping after {written} chunks");
            break;
        }
        let fence = guard.lease().fencing_token();
        store
            .append(fence, format!("{name} chunk {chunk} (fence {fence})"))
            .map_err(JobError::Store)?;
        written += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    Ok(written)
}

async fn worker(
    name: &'static str,
    client: Client,
    key: &'static str,
    ticks: u32,
    store: Arc<FencedStore>,
) {
    let locks = client.locks();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    for _ in 0..ticks {
        tick.tick().await;
        let store = store.clone();
        // `None`: another worker holds the lock, and the job did not run.
        let result = locks
            .try_with_lock(key, Duration::from_secs(15), |guard| async move {
                let fence = guard.lease().fencing_token();
                println!("{name}: running the job with fencing token {fence}");
                nightly_report(name, guard, &store).await
            })
            .await;
        match result {
            Ok(Some(chunks)) => println!("{name}: done, {chunks} chunks written, lock released"),
            Ok(None) => println!("{name}: another worker runs the job this tick"),
            Err(JobError::Store(refusal)) => {
                println!("{name}: the store refused a write: {refusal}")
            }
            Err(JobError::Lock(err)) => println!("{name}: job failed: {err}"),
        }
    }
}

/// Ctrl-C, or SIGTERM from a process supervisor.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .init();
    let ticks = std::env::var("WORKER_TICKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);

    let (client, _mock, key) = if configured() {
        (Client::from_env()?, None, "volcano-example-worker")
    } else {
        let server = MockServer::start().await;
        let client = Client::for_mock(&server);
        println!("(in-process mock lock server at {})", server.url());
        (client, Some(server), "nightly-report")
    };

    let store = Arc::new(FencedStore::default());
    let mut workers = tokio::task::JoinSet::new();
    for name in ["worker-a", "worker-b"] {
        workers.spawn(worker(name, client.clone(), key, ticks, store.clone()));
    }
    let stopped = tokio::select! {
        _ = async { while workers.join_next().await.is_some() {} } => false,
        _ = stop_signal() => true,
    };
    if stopped {
        println!("\nstopping: cancelling the running jobs");
        workers.abort_all();
        while workers.join_next().await.is_some() {}
    }
    // Cancelled jobs hand their release to the client; wait for them
    // before the runtime (and every task on it) goes away.
    let unfinished = client.shutdown(Duration::from_secs(5)).await;
    if !unfinished.is_empty() {
        eprintln!("releases still running for {unfinished:?}; those locks expire at their ttl");
    }

    println!(
        "\nThe store accepted {} chunks; newest fencing token {}.",
        store.lines.lock().unwrap().len(),
        store.gate.highest_seen("report").unwrap_or_default()
    );
    Ok(())
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
