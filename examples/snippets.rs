//! The README's and guides' code blocks, compiled.
//!
//! Every `rust` code block of `README.md` and `docs/guide/*.md` appears below,
//! verbatim once its common indentation is removed, as the body of one
//! `snippet_*` function (the comment above each names where it comes
//! from). The functions are never called: compiling them checks that each
//! block uses the API as it is. The helpers stand for your own code: the
//! store, the job, the error type. `#[rustfmt::skip]` keeps each block as
//! the page shows it.
#![allow(dead_code, unused, clippy::all, clippy::pedantic)]

use std::sync::Arc;
use std::time::Duration;

use volcano::LeaderStatus;

/// The error type of the jobs: `with_lock` and the others need
/// `From<volcano::Error>`, so that the lock's own failures arrive in it.
#[derive(Debug)]
enum MyError {
    /// The lock service, or a lost lock.
    Lock(volcano::Error),
    /// The job saw its guard lost and stopped.
    Lost,
    /// The store refused a stale fencing token.
    Stale,
}

impl From<volcano::Error> for MyError {
    fn from(err: volcano::Error) -> Self {
        MyError::Lock(err)
    }
}

/// A store that rejects writes with a fencing token lower than the highest
/// it has seen.
struct Store;

impl Store {
    fn new() -> Self {
        Store
    }

    fn write(&self, data: &[u8], fence: i64) -> Result<(), MyError> {
        let _ = (data, fence);
        Ok(())
    }
}

/// A job: a unit of work a leader runs.
struct Job;

async fn write_report(fence: i64) -> Result<(), MyError> {
    let _ = fence;
    Ok(())
}

async fn run_report(fence: i64) -> Result<u64, MyError> {
    let _ = fence;
    Ok(0)
}

fn report_chunks() -> Vec<Vec<u8>> {
    vec![b"first".to_vec(), b"second".to_vec()]
}

async fn ingest(fence: i64) {
    let _ = fence;
}

async fn checkpoint() {}

async fn schedule_jobs(store: &Store, fence: i64) -> Result<(), MyError> {
    store.write(b"schedule", fence)
}

async fn schedule_next(store: &Store, fence: i64) -> Result<(), MyError> {
    store.write(b"next", fence)
}

async fn next_job() -> Job {
    Job
}

async fn run_job(job: Job, fence: i64) -> Result<(), MyError> {
    let _ = (job, fence);
    Ok(())
}

async fn call_partner(key: &str, fence: i64) -> Result<(), MyError> {
    let _ = (key, fence);
    Ok(())
}

async fn transfer(accounts: Option<i64>, ledger: Option<i64>) -> Result<(), MyError> {
    let _ = (accounts, ledger);
    Ok(())
}

async fn my_job(client: volcano::Client) -> Result<(), MyError> {
    let _ = client;
    Ok(())
}

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
        .drain(Duration::from_secs(30))                  // ... once the job in hand is done
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

/// docs/guide/jobs.md, "Scoped locks: `with_lock`"
#[rustfmt::skip]
async fn snippet_with_lock(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let store = Store::new();
    let chunks = report_chunks();
    let fence = locks
        .with_lock("daily-report", Duration::from_secs(30), |guard| async move {
            let fence = guard.lease().fencing_token();
            for chunk in chunks {
                if guard.is_lost() { return Err(MyError::Lost); } // or: guard.lost().await in select!
                store.write(&chunk, fence)?;                      // the store rejects stale fences
            }
            Ok::<_, MyError>(fence)                              // MyError: From<volcano::Error>
        })
        .await?;
    Ok(())
}

/// docs/guide/jobs.md, "Holding a lock for a long time: `hold`"
#[rustfmt::skip]
async fn snippet_hold(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let held = locks.hold("ingest", Duration::from_secs(30)) // also .token(..), .request_id(..), .wait(..)
        .await?;                                               // HeldLock: Send + Sync + 'static
    let fence = held.lease().fencing_token();                  // derefs to LockGuard
    tokio::select! {
        _ = held.lost() => eprintln!("lost the lock; stop writing"),
        _ = ingest(fence) => {}
    }
    held.release().await?;                                     // Err(LockLost) if it was lost meanwhile
    Ok(())
}

/// docs/guide/jobs.md, "An early warning before a loss: `at_risk`"
#[rustfmt::skip]
async fn snippet_at_risk(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let held = locks.hold("ingest", Duration::from_secs(30)).await?;
    loop {
        tokio::select! {
            _ = held.lost() => break,                      // gone: stop writing
            _ = held.at_risk_changed() => if let Some(risk) = held.at_risk() {
                checkpoint().await;                         // maybe gone in risk.remaining()
                eprintln!("{risk}");
            },
        }
    }
    Ok(())
}

/// docs/guide/jobs.md, "Several keys at once: `hold_all`, `with_locks`"
#[rustfmt::skip]
async fn snippet_several_keys(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let set = locks.hold_all(["accounts", "ledger"], Duration::from_secs(30))
        .wait(Duration::from_secs(30))                  // one deadline for the whole set
        .await?;                                         // HeldLocks
    let ledger_fence = set.fencing_token("ledger");      // Option<i64>
    set.release().await?;

    locks
        .with_locks(["accounts", "ledger"], Duration::from_secs(30), |set| async move {
            transfer(set.fencing_token("accounts"), set.fencing_token("ledger")).await
        })
        .await?;
    Ok(())
}

/// docs/guide/leader.md, "Running a leader"
#[rustfmt::skip]
async fn snippet_leader(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let store = Arc::new(Store::new());
    let shutdown = async { tokio::signal::ctrl_c().await.ok(); }; // SIGTERM too: examples/leader_probe.rs
    locks.leader("scheduler", Duration::from_secs(15))
        .until(shutdown)                                // step down cleanly
        .run(move |term| {
            let store = Arc::clone(&store);             // one clone per term
            async move {
                let fence = term.lease().fencing_token(); // higher in every term
                schedule_jobs(&store, fence).await        // the store rejects older fences
            }
        })
        .await?;
    Ok(())
}

/// docs/guide/leader.md, "Drain before stepping down"
#[rustfmt::skip]
async fn snippet_leader_drain(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let shutdown = async { tokio::signal::ctrl_c().await.ok(); };
    locks.leader("scheduler", Duration::from_secs(15))
        .until(shutdown)
        .drain(Duration::from_secs(30))
        .run(|term| async move {
            loop {
                tokio::select! {
                    () = term.stepping_down() => break,  // finish the job in hand, then return
                    job = next_job() => run_job(job, term.lease().fencing_token()).await?,
                }
            }
            Ok::<(), MyError>(())
        })
        .await?;
    Ok(())
}

/// docs/guide/leader.md, "What a probe should ask"
#[rustfmt::skip]
async fn snippet_leader_probes(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let leader = locks.leader("scheduler", Duration::from_secs(15));
    let status = leader.status();
    let health = leader.health();
    // Readiness: a healthy candidate, leading or not.
    let ready = match *status.borrow() {
        LeaderStatus::Leading { .. } | LeaderStatus::SteppingDown { .. } | LeaderStatus::Following => true,
        LeaderStatus::Unreachable { since } => since.elapsed() < Duration::from_secs(30),
        LeaderStatus::Stopped => false,
        _ => false, // a status added in a later version
    };
    // Liveness: the running term outlived its lock by more than 5 s (confirm on a second probe).
    let overdue = health.overdue().is_some_and(|late| late > Duration::from_secs(5));
    Ok(())
}

/// docs/guide/observe.md, "Using it"
#[rustfmt::skip]
async fn snippet_observe(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    use volcano::ChangeKind;
    let mut changes = locks.observe("nightly-report");
    while let Some(change) = changes.next().await {
        let change = match change {
            Ok(change) => change,
            Err(e) => { eprintln!("look failed: {e}"); continue; } // a refused look ends the stream
        };
        match change.kind() {
            ChangeKind::TakenOver => println!("new holder, fence {:?}", change.state().fencing_token()),
            ChangeKind::Expired => println!("its holder stopped renewing"),
            kind => println!("{kind}, {:?} left", change.remaining()),
        }
    }
    Ok(())
}

/// docs/guide/semaphore.md, "Using it"
#[rustfmt::skip]
async fn snippet_semaphore(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    let partner = locks.semaphore("partner-api", 4);           // volcano::Semaphore, Clone
    partner
        .with_permit(Duration::from_secs(30), |permit| async move {
            let lease = permit.lease();
            call_partner(lease.key(), lease.fencing_token()).await  // fence per permit
        })
        .wait(Duration::from_secs(60))                           // like with_lock
        .await?;
    let ran = partner
        .try_with_permit(Duration::from_secs(30), |permit| async move {
            call_partner(permit.key(), permit.lease().fencing_token()).await
        })
        .await?;                                                 // None: every permit is taken
    let permit = partner.acquire(Duration::from_secs(30)).wait(Duration::from_secs(30)).await?; // a HeldLock
    permit.release().await?;
    Ok(())
}

fn main() {}
