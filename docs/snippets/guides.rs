//! The guides' code blocks (docs/guide/*.md; see main.rs).

use super::*;
use std::sync::Arc;
use std::time::Duration;
use volcano::LeaderStatus;

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
        .drain(Duration::from_secs(20))
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

/// docs/guide/tower.md, "Errors, and a lock held elsewhere"
#[rustfmt::skip]
async fn snippet_tower(locks: volcano::Locks, client: volcano::Client) -> Result<(), MyError> {
    use tower::{ServiceBuilder, ServiceExt as _};
    use volcano::tower::LockLayer;
    let export = Export { id: 7 };
    let exports = ServiceBuilder::new()
        .layer(LockLayer::new(locks.clone(), Duration::from_secs(30), |e: &Export| format!("export-{}", e.id)))
        .service_fn(run_export);
    match exports.oneshot(export).await {
        Ok(()) => {}
        Err(err) => match err.downcast_ref::<volcano::Error>() {
            Some(lock) if lock.is_lock_held() => println!("another worker runs it: try later"),
            Some(lock) => println!("the lock failed: {lock}"),
            None => println!("the export failed: {err}"), // run_export's own error, boxed
        },
    }
    Ok(())
}
