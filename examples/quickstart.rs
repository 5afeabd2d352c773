//! The quick start: two workers contend for a lock, fencing tokens rise, a
//! crashed holder's lease is recovered, and a stale write is rejected.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! With neither `VOLCANO_API_URL` nor `VOLCANO_SERVICE_KEY` set it starts an
//! in-process mock lock server. With them (and `VOLCANO_ANON_KEY`) set it
//! talks to that service instead (lock key `volcano-quickstart-daily-report`,
//! so it never touches a real job's lock). `RUST_LOG=volcano=debug` shows
//! the SDK's own log lines.

use std::time::Duration;

use volcano::mock::MockServer;
use volcano::{Client, Error};
use volcano_fence::Gate;

const TTL: Duration = Duration::from_secs(5);

/// The protected resource: the report, behind a fence gate
/// (`volcano_fence::Gate`) that remembers the highest fencing token it has
/// seen and refuses writes that carry a lower one. In PostgreSQL,
/// `volcano_fence::sqlx::check` does the same inside the write's
/// transaction.
#[derive(Default)]
struct ReportStore {
    gate: Gate,
}

impl ReportStore {
    fn write(&self, fence: i64, by: &str) -> Result<(), String> {
        self.gate
            .check("daily-report", fence)
            .map_err(|stale| format!("rejected {by}'s write: {stale}"))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .init();
    run().await
}

/// The whole story; `cargo test --example quickstart` runs it too.
async fn run() -> Result<(), BoxError> {
    println!("Volcano locks quick start");
    println!("=========================\n");

    // Either the real service from the environment, or a local mock.
    let (client, mock, key) = if configured() {
        let client = Client::from_env()?;
        println!("Using the lock service at {}.\n", client.api_url());
        (client, None, "volcano-quickstart-daily-report")
    } else {
        let server = MockServer::start().await;
        println!(
            "No VOLCANO_API_URL or VOLCANO_SERVICE_KEY set: started an in-process mock lock server at {}.",
            server.url()
        );
        println!(
            "(Set VOLCANO_API_URL, VOLCANO_SERVICE_KEY and VOLCANO_ANON_KEY to use a real one.)\n"
        );
        let client = Client::for_mock(&server);
        (client, Some(server), "daily-report")
    };
    let locks = client.locks();
    let store = ReportStore::default();
    // Leftovers from an earlier interrupted run would spoil the story.
    locks.force_release(key).await?;

    // ------------------------------------------------------------------
    println!("1. Two workers want to run {key:?} at the same time.");
    let (holding_tx, holding_rx) = tokio::sync::oneshot::channel();
    let (go_on_tx, go_on_rx) = tokio::sync::oneshot::channel::<()>();
    let worker_a = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_lock(key, TTL, |guard| async move {
                    let fence = guard.lease().fencing_token();
                    println!(
                        "   worker-a: got the lock (fencing token {fence}); writing the report..."
                    );
                    let _ = holding_tx.send(fence);
                    let _ = go_on_rx.await;
                    Ok::<_, Error>(fence)
                })
                .await
        })
    };
    let fence_a = holding_rx.await?;
    let attempt = locks
        .with_lock(key, TTL, |_guard| async { Ok::<_, Error>(()) })
        .await;
    match attempt {
        Err(err) if err.is_lock_held() => println!(
            "   worker-b: refused with {} {}: another worker holds it; skipping this run.",
            err.status().unwrap_or_default(),
            err.code().unwrap_or_default()
        ),
        other => return Err(format!("worker-b should have been refused, got {other:?}").into()),
    }
    store.write(fence_a, "worker-a")?;
    go_on_tx.send(()).ok();
    worker_a.await??;
    println!("   worker-a: report written, lock released.");
    let fence_b = locks
        .with_lock(key, TTL, |guard| async move {
            let fence = guard.lease().fencing_token();
            println!("   worker-b: tries again and gets the lock (fencing token {fence}).");
            Ok::<_, Error>(fence)
        })
        .await?;
    store.write(fence_b, "worker-b")?;
    println!("   The fencing token rose from {fence_a} to {fence_b}: the lock changed hands.\n");

    // ------------------------------------------------------------------
    println!("2. A worker crashes while holding the lock.");
    let crashed = locks.acquire(key, TTL).await?;
    println!(
        "   worker-c: got the lock (fencing token {}) and crashed without releasing it.",
        crashed.fencing_token()
    );
    drop(crashed);
    match locks.acquire(key, TTL).await {
        Err(err) if err.is_lock_held() => {
            let state = locks.get(key).await?;
            println!(
                "   worker-d: refused, the lock is held until {} (advisory server time).",
                state
                    .expires_at()
                    .map_or("?".into(), |t| t.format("%H:%M:%S").to_string())
            );
        }
        other => return Err(format!("worker-d should have been refused, got {other:?}").into()),
    }
    match &mock {
        Some(server) => {
            println!("   ... 6 seconds pass (the mock server's clock is moved forward) ...");
            server.advance(TTL + Duration::from_secs(1));
        }
        None => {
            println!("   ... waiting 6 seconds for the lease to expire ...");
            tokio::time::sleep(TTL + Duration::from_secs(1)).await;
        }
    }
    let stalled = locks.acquire(key, Duration::from_secs(30)).await?;
    println!(
        "   worker-d: the crashed worker's lease expired; got the lock (fencing token {}).\n",
        stalled.fencing_token()
    );

    // ------------------------------------------------------------------
    println!("3. A worker stalls; an operator force-releases its lock.");
    println!(
        "   worker-d: stalls while holding fencing token {} (a GC pause, swap, a stuck disk...).",
        stalled.fencing_token()
    );
    locks.force_release(key).await?;
    println!("   operator: force_release({key:?}). This breaks mutual exclusion by itself:");
    println!("             worker-d does not know yet and may still write.");
    let fence_e = locks
        .with_lock(key, TTL, |guard| async move {
            Ok::<_, Error>(guard.lease().fencing_token())
        })
        .await?;
    store.write(fence_e, "worker-e")?;
    println!("   worker-e: got the lock (fencing token {fence_e}) and wrote the report.");
    match store.write(stalled.fencing_token(), "worker-d") {
        Err(rejected) => println!("   worker-d: wakes up and writes: the store {rejected}."),
        Ok(()) => return Err("the store accepted a stale write".into()),
    }
    match locks.renew(&stalled, Duration::from_secs(30)).await {
        Err(err) if err.is_ownership_lost() => println!(
            "   worker-d: tries to renew: refused with {} {}, so it knows the lock is gone and stops.\n",
            err.status().unwrap_or_default(),
            err.code().unwrap_or_default()
        ),
        other => return Err(format!("worker-d's renewal should fail, got {other:?}").into()),
    }

    println!("What to take away:");
    println!("  - A lease is a promise with an expiry, not a guarantee: a paused process can");
    println!("    outlive its lease and keep going.");
    println!("  - The fencing token rises every time the lock changes hands. Pass it with every");
    println!("    write and let the protected resource reject anything older than the newest");
    println!("    it has seen; that is what stopped worker-d.");
    if let Some(server) = &mock {
        println!(
            "\nThe mock server saw {} lock requests.",
            server.requests().len()
        );
    }
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

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_story_runs_on_the_mock_server() {
        assert!(
            !super::configured(),
            "unset VOLCANO_API_URL and VOLCANO_SERVICE_KEY to test"
        );
        super::run().await.unwrap();
    }
}
