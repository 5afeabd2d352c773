//! The README's code blocks (see main.rs).

use super::*;
use std::sync::Arc;
use std::time::Duration;
use volcano::LeaderStatus;

/// README.md, "The API in 20 lines"
#[rustfmt::skip]
async fn snippet_api_in_20_lines(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    use std::time::Duration;
    use volcano::Client;

    let client = Client::from_env()?;       // VOLCANO_SERVICE_KEY (required), VOLCANO_API_URL, VOLCANO_ANON_KEY
    let locks = client.locks();             // cheap to clone, Send + Sync + 'static

    let lease = locks.acquire("daily-report", Duration::from_secs(30)).await?;
    write_report(lease.fencing_token()).await?;       // your write: the store rejects stale fences
    let lease = locks.renew(&lease, Duration::from_secs(30)).await?;
    let state = locks.get("daily-report").await?;     // held, expires_at, fencing_token
    locks.release(&lease).await?;

    // Optional parameters are builder methods; `.await` sends the request.
    let lease = locks.acquire("daily-report", Duration::from_secs(30))
        .token("0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10")  // caller-owned: re-acquire to recover
        .request_id("6d0c8f5e-1f0a-4b7e-9f43-6a1d2b3c4d5e")
        .await?;
    match locks.acquire("daily-report", Duration::from_secs(30)).await {
        Err(e) if e.is_lock_held() => println!("another worker has it"), // here: the lease just above
        Err(e) => eprintln!("{e} (status {:?}, request id {:?})", e.status(), e.request_id()),
        Ok(other) => locks.release(&other).await?,
    }
    locks.force_release("daily-report").await?;      // recovery only: breaks mutual exclusion
    Ok(())
}

/// README.md, "Once per period: `try_with_lock` and `min_hold`" and docs/guide/jobs.md, "Run a job once across workers: `try_with_lock`"
#[rustfmt::skip]
async fn snippet_try_with_lock_min_hold(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    // Every host runs this every 5 minutes; whoever gets the lock runs the job.
    let ran = locks
        .try_with_lock("nightly-report", Duration::from_secs(60), |guard| async move {
            let fence = guard.lease().fencing_token(); // i64: hand it to the store
            run_report(fence).await                    // Result<u64, MyError>, MyError: From<volcano::Error>
        })
        .min_hold(Duration::from_secs(60))             // hosts that fire a little later skip too
        .await?;
    match ran {
        Some(rows) => println!("report done: {rows} rows"),
        None => println!("another host has it; skipping this run"),
    }
    Ok(())
}

/// README.md, "A job under a lock: `with_lock`"
#[rustfmt::skip]
async fn snippet_with_lock_short(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    locks
        .with_lock("daily-report", Duration::from_secs(30), |guard| async move {
            if guard.is_lost() { return Err(MyError::Lost); }  // check before each side effect
            write_report(guard.lease().fencing_token()).await   // the store rejects stale fences
        })
        .await?;
    Ok(())
}

/// README.md, "A lock kept in a value: `hold`"
#[rustfmt::skip]
async fn snippet_hold_short(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let held = locks.hold("ingest", Duration::from_secs(30)).await?; // HeldLock: Send + Sync + 'static
    tokio::select! {
        _ = held.lost() => eprintln!("lost the lock; stop writing"),
        _ = ingest(held.lease().fencing_token()) => {}
    }
    held.release().await?;                                           // Err(LockLost) if it was lost meanwhile
    Ok(())
}

/// README.md, "One replica leads: `leader`"
#[rustfmt::skip]
async fn snippet_leader_drain_short(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let store = Arc::new(Store::new());
    let shutdown = async { tokio::signal::ctrl_c().await.ok(); }; // SIGTERM too: examples/leader_probe.rs
    locks.leader("scheduler", Duration::from_secs(15))
        .until(shutdown)                                 // step down on Ctrl-C ...
        .drain(Duration::from_secs(20))                  // ... once the job in hand is done
        .run(move |term| {
            let store = Arc::clone(&store);              // one clone per term
            async move {
                let fence = term.lease().fencing_token(); // higher in every term
                while !term.is_stepping_down() {
                    schedule_next(&store, fence).await?;  // the store rejects older fences
                }
                Ok::<(), MyError>(())
            }
        })
        .await?;
    Ok(())
}

/// README.md, "At most N at once: `semaphore`"
#[rustfmt::skip]
async fn snippet_semaphore_short(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let partner = locks.semaphore("partner-api", 4);                   // at most 4 holders, fleet-wide
    let permit = partner.acquire(Duration::from_secs(30))              // a HeldLock on "partner-api:i"
        .wait(Duration::from_secs(60))
        .await?;
    call_partner(permit.key(), permit.lease().fencing_token()).await?; // fence per permit
    permit.release().await?;
    Ok(())
}

/// README.md, "Several keys at once: `with_locks`"
#[rustfmt::skip]
async fn snippet_with_locks_short(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    locks
        .with_locks(["accounts", "ledger"], Duration::from_secs(30), |set| async move {
            transfer(set.fencing_token("accounts"), set.fencing_token("ledger")).await
        })
        .await?;
    Ok(())
}

/// README.md, "Watching a key: `observe`"
#[rustfmt::skip]
async fn snippet_observe_short(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let mut changes = locks.observe("nightly-report");   // a look every 10 s by default
    while let Some(change) = changes.next().await {
        println!("{}", change?.kind());                    // acquired, renewed, taken_over, released, expired ...
    }
    Ok(())
}

/// README.md, "Uncertain outcomes and `shutdown`" and docs/guide/outcomes.md, "Shutdown"
#[rustfmt::skip]
async fn snippet_shutdown(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let unfinished = client.shutdown(Duration::from_secs(5)).await; // keys that may still be held
    Ok(())
}

/// README.md, "Testing your code"
#[rustfmt::skip]
async fn snippet_testing_with_the_mock(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    use volcano::mock::{Fault, MockServer, Operation};

    let server = MockServer::start().await;                          // 127.0.0.1, random port
    let client = volcano::Client::for_mock(&server);                 // its URL and keys
    server.inject(Fault::status(409).on(Operation::Renew));          // also 503s, drop_response, delays
    let job = tokio::spawn(my_job(client.clone()));
    let refused = server.wait_for(Operation::Renew, 409, Duration::from_secs(10)).await; // no polling
    server.advance(Duration::from_secs(31));                         // expire leases without sleeping
    server.requests();                                               // journal: op, key, request id, status
    Ok(())
}
