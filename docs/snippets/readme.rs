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

/// README.md, "A job once across hosts" and docs/guide/jobs.md, "Run a job once across workers: `try_with_lock`"
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
