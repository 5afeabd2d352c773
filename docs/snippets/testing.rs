//! The testing guide's code blocks (docs/testing.md; see main.rs). Its
//! tests are compiled as items of a module each, never run here.

use super::*;
use std::time::Duration;

/// docs/testing.md, "A client against the mock"
#[rustfmt::skip]
mod snippet_client_against_the_mock {
    use super::*;
    use std::time::Duration;
    use volcano::mock::{Fault, MockServer, Operation};
    use volcano::Client;

    #[tokio::test]
    async fn the_report_runs_once_while_another_worker_holds_the_lock() {
        let server = MockServer::start().await;          // 127.0.0.1, random port
        let client = Client::for_mock(&server);          // its URL and keys

        let other = client.locks().acquire("nightly-report", Duration::from_secs(30)).await.unwrap();
        let ran = my_app::run_nightly_report(&client).await.unwrap();
        assert_eq!(ran, None, "skipped: another worker holds the lock");
        client.locks().release(&other).await.unwrap();
    }
}

/// docs/testing.md, "A client against the mock" (a test clock)
#[rustfmt::skip]
async fn snippet_client_with_a_clock(server: volcano::mock::MockServer) -> Result<(), MyError> {
    use volcano::Client;
    let clock = volcano::LeaseClock::adjustable();
    let client = Client::builder()
        .api_url(server.url())
        .service_key(server.service_key())
        .lease_clock(clock.clone())
        .build()?;
    Ok(())
}

/// docs/testing.md, "Faults"
#[rustfmt::skip]
async fn snippet_faults(server: volcano::mock::MockServer) -> Result<(), MyError> {
    use volcano::mock::{Fault, Operation};
    server.inject(Fault::status(503).on(Operation::Acquire).times(1));   // the SDK retries acquire once
    server.inject(Fault::status(409).on(Operation::Renew));              // the next renewal is refused: the guard is lost
    server.inject(Fault::drop_response().on(Operation::Release));        // applied, then the connection closes
    server.inject(Fault::delay_response(Duration::from_secs(2)));        // applied at once, answered late
    server.inject(Fault::garbled_response().on(Operation::Acquire));     // applied, answered with an HTML page
    server.inject(                                                        // 504 after 400 ms; applied at 1.5 s
        Fault::gateway(504, Duration::from_millis(400), Duration::from_millis(1500))
            .on(Operation::Acquire)
            .times(1),
    );
    server.clear_faults();
    Ok(())
}

/// docs/testing.md, "Waiting for something to happen"
#[rustfmt::skip]
async fn snippet_wait_for(server: volcano::mock::MockServer, client: volcano::Client) -> Result<(), MyError> {
    use volcano::mock::{Fault, Operation};
    server.inject(Fault::status(409).on(Operation::Renew));
    let job = tokio::spawn(my_app::long_job(client.clone()));
    server
        .wait_for(Operation::Renew, 409, Duration::from_secs(10))
        .await
        .expect("the renewal was refused");
    assert!(matches!(job.await.unwrap(), Err(my_app::Error::LockLost)));
    Ok(())
}

/// docs/testing.md, "A fault in the middle of the job"
#[rustfmt::skip]
async fn snippet_a_fault_mid_job(server: volcano::mock::MockServer, client: volcano::Client, clock: volcano::LeaseClock) -> Result<(), MyError> {
    let (running_tx, running) = tokio::sync::oneshot::channel();
    let job = tokio::spawn({
        let locks = client.locks();
        async move {
            locks
                .with_lock("nightly-report", Duration::from_secs(30), |guard| async move {
                    let _ = running_tx.send(guard.lease().fencing_token()); // now the job runs
                    my_app::write_report(&guard).await                      // checks guard.is_lost()
                })
                .await
        }
    });
    let fence = running.await.expect("the job started");
    clock.advance(Duration::from_secs(31));       // a suspend mid-job (LeaseClock::adjustable)
    server.advance(Duration::from_secs(32));      // ... and the server saw the lease expire
    assert!(matches!(job.await.unwrap(), Err(volcano::Error::LockLost(_))));
    Ok(())
}

/// docs/testing.md, "A 503 in the middle of a job"
#[rustfmt::skip]
mod snippet_a_503_mid_job {
    use super::*;
    use std::time::Duration;
    use volcano::mock::{Fault, MockServer, Operation};
    use volcano::Client;

    #[tokio::test]
    async fn a_503_on_a_renewal_does_not_stop_the_job() {
        let server = MockServer::start().await;
        let client = Client::for_mock(&server);
        server.inject(Fault::status(503).on(Operation::Renew).times(1)); // the first renewal only

        let job = tokio::spawn({
            let locks = client.locks();
            async move {
                locks
                    .with_lock(
                        "nightly-report",
                        Duration::from_secs(5),
                        |guard| async move {
                            // The job outlasts the first renewal (about 1.7 s into a 5 s lease).
                            tokio::time::sleep(Duration::from_secs(3)).await;
                            Ok::<_, volcano::Error>(guard.lease().fencing_token())
                        },
                    )
                    .await
            }
        });

        let refused = server
            .wait_for(Operation::Renew, 503, Duration::from_secs(10))
            .await
            .expect("a renewal was answered 503");
        assert_eq!(refused.key, "nightly-report");
        server
            .wait_for(Operation::Renew, 200, Duration::from_secs(10))
            .await
            .expect("the retry renewed the lease");

        let fence = job
            .await
            .unwrap()
            .expect("the job completed: a 503 is retried, not a loss");
        assert!(fence > 0);
        assert!(server
            .requests()
            .iter()
            .any(|r| r.operation == Operation::Release && r.status == Some(204)));
        assert!(
            server.locks().is_empty(),
            "the lock was released: the server keeps no lease"
        );
        assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    }
}

/// docs/testing.md, "An outage while the job runs: the early warning"
#[rustfmt::skip]
async fn snippet_at_risk(server: volcano::mock::MockServer, client: volcano::Client) -> Result<(), MyError> {
    use volcano::mock::{Fault, Operation};
    server.inject(Fault::status(503).on(Operation::Renew).times(2)); // two failures, then renewals succeed
    let held = client.locks().hold("nightly-report", Duration::from_secs(5)).await?;
    held.at_risk_changed().await;                              // the first 503: an episode begins
    let risk = held.at_risk().expect("at risk");
    assert_eq!(risk.cause().status(), Some(503));              // an outage, not a refusal
    held.at_risk_changed().await;                              // a renewal succeeded: it clears
    assert!(held.at_risk().is_none() && !held.is_lost());
    Ok(())
}

/// docs/testing.md, "A cron job kept for its minimum"
#[rustfmt::skip]
async fn snippet_cron_minimum(server: volcano::mock::MockServer, client: volcano::Client, locks: volcano::Locks, other: volcano::Locks, ttl: Duration) -> Result<(), MyError> {
    let ran = locks.try_with_lock("nightly-report", ttl, |_guard| async { Ok::<_, volcano::Error>(()) })
        .min_hold(Duration::from_secs(60))
        .await?;                                  // returns as soon as the job ended
    client.shutdown(Duration::from_secs(5)).await; // the process may exit: the key stays taken
    let second = other.try_with_lock("nightly-report", ttl, |_guard| async { Ok::<_, volcano::Error>(()) }).await?;
    assert_eq!(second, None);                     // still held: this host skips
    server.advance(Duration::from_secs(62));      // the minimum's end, its rounding and the grace
    // ... now a try runs ...
    Ok(())
}

/// docs/testing.md, "A leader whose term is stuck"
#[rustfmt::skip]
async fn snippet_stuck_leader() -> Result<(), MyError> {
    use volcano::Client;
    let clock = volcano::LeaseClock::adjustable();
    let client = Client::builder() /* ... */ .lease_clock(clock.clone()).build()?;
    let leader = client.locks().leader("scheduler", Duration::from_secs(5));
    let health = leader.health();
    // ... run a term that blocks its thread (say, on a std channel) ...
    clock.advance(Duration::from_secs(8));          // the blocking call took longer than the lease
    assert!(health.overdue() >= Some(Duration::from_secs(3)));
    Ok(())
}

/// docs/testing.md, "Watching who holds a key"
#[rustfmt::skip]
async fn snippet_observe(server: volcano::mock::MockServer, locks: volcano::Locks, ttl: Duration) -> Result<(), MyError> {
    use volcano::ChangeKind;
    let first = locks.acquire("nightly-report", ttl).await?;
    let mut changes = locks.observe("nightly-report").poll_interval(Duration::from_millis(100));
    assert_eq!(changes.next().await.unwrap()?.kind(), ChangeKind::Initial);    // held by `first`
    locks.release(&first).await?;
    let again = locks.acquire("nightly-report", ttl).await?;   // released and taken between two looks
    server.advance(ttl);                                        // its expiry: shown in the 1 s grace, past renewing
    assert_eq!(changes.next().await.unwrap()?.kind(), ChangeKind::TakenOver);  // a new fence, no free state seen
    server.advance(Duration::from_secs(3));                     // past the grace
    assert_eq!(changes.next().await.unwrap()?.kind(), ChangeKind::Expired);
    Ok(())
}

/// docs/testing.md, "Background releases"
#[rustfmt::skip]
async fn snippet_background_releases(client: volcano::Client) -> Result<(), MyError> {
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    Ok(())
}
