//! What a new user reaches for in the first hour: skipping a run when the
//! lock is held, futures that can be spawned, errors that say whether to
//! retry and read once, and awaiting the mock server's journal.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use volcano::mock::{Fault, MockServer, Operation};
use volcano::{Client, Error, LostReason};
use wiremock::ResponseTemplate;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn try_with_lock_runs_when_free_and_skips_when_held_elsewhere() {
    let server = MockServer::start().await;
    let client = Client::for_mock(&server);
    let locks = client.locks();

    let ran = locks
        .try_with_lock("report", TTL, |guard| async move {
            Ok::<_, Error>(guard.lease().fencing_token())
        })
        .await
        .unwrap();
    assert_eq!(ran, Some(1));

    let other = locks.acquire("report", TTL).await.unwrap();
    let called = AtomicBool::new(false);
    let skipped = locks
        .try_with_lock("report", TTL, |_guard| async {
            called.store(true, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert_eq!(skipped, None, "held elsewhere: nothing ran");
    assert!(!called.load(Ordering::SeqCst));

    // A wait that runs out skips too.
    let skipped = locks
        .try_with_lock("report", TTL, |_guard| async { Ok::<_, Error>(()) })
        .wait(Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(skipped, None);
    locks.release(&other).await.unwrap();
    assert!(server.locks().iter().all(|l| !l.live));
}

#[tokio::test]
async fn a_lock_held_inside_the_job_is_the_jobs_error_not_a_skip() {
    let server = MockServer::start().await;
    let client = Client::for_mock(&server);
    let locks = client.locks();
    let _elsewhere = locks.acquire("other", TTL).await.unwrap();
    let inner = locks.clone();
    let err = locks
        .try_with_lock("report", TTL, |_guard| async move {
            inner.acquire("other", TTL).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(err.is_lock_held(), "{err}");
    // The outer lock was released all the same.
    assert!(!server.locks().iter().any(|l| l.key == "report" && l.live));
}

#[tokio::test]
async fn a_loss_during_try_with_lock_is_an_error() {
    let server = MockServer::start().await;
    server.inject(Fault::status(409).on(Operation::Renew));
    let client = Client::for_mock(&server);
    let err = client
        .locks()
        .try_with_lock("report", Duration::from_secs(5), |guard| async move {
            guard.lost().await;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    let Error::LockLost(lost) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(lost.reason(), LostReason::RenewalFailed);
}

#[tokio::test]
async fn every_builder_has_a_send_that_can_be_spawned() {
    let server = MockServer::start().await;
    let client = Client::for_mock(&server);
    let locks = client.locks();
    let lease = tokio::spawn(locks.acquire("a", TTL).send())
        .await
        .unwrap()
        .unwrap();
    let lease = tokio::spawn(locks.renew(&lease, TTL).send())
        .await
        .unwrap()
        .unwrap();
    let state = tokio::spawn(locks.get("a").send()).await.unwrap().unwrap();
    assert!(state.held());
    tokio::spawn(locks.release(&lease).send())
        .await
        .unwrap()
        .unwrap();
    tokio::spawn(locks.force_release("a").send())
        .await
        .unwrap()
        .unwrap();
    let held = tokio::spawn(locks.hold("b", TTL).send())
        .await
        .unwrap()
        .unwrap();
    held.release().await.unwrap();
    let value = tokio::spawn(
        locks
            .with_lock("c", TTL, |_guard| async { Ok::<_, Error>(7) })
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(value, 7);
    let ran = tokio::spawn(
        locks
            .try_with_lock("c", TTL, |_guard| async { Ok::<_, Error>(8) })
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(ran, Some(8));
}

#[tokio::test]
async fn is_transient_says_which_failures_are_worth_retrying() {
    let server = server().await;
    let statuses = [
        (400, false),
        (401, false),
        (403, false),
        (404, false),
        (409, false),
        (429, true),
        (500, true),
        (502, true),
        (503, true),
        (504, true),
        (501, false),
    ];
    for (status, transient) in statuses {
        server.reset().await;
        mount(
            &server,
            "GET",
            error_body(status, "x", None).insert_header("retry-after", "1"),
        )
        .await;
        let err = client(&server.uri()).locks().get("k").await.unwrap_err();
        assert_eq!(err.is_transient(), transient, "{status}: {err}");
    }
    // No answer at all.
    let dropper = Dropper::start().await;
    let err = client(&dropper.url).locks().get("k").await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    // Local refusals and losses are not.
    let err = client(&dropper.url)
        .locks()
        .get("not a valid key")
        .await
        .unwrap_err();
    assert!(!err.is_transient());
}

#[tokio::test]
async fn a_lost_lock_reads_once_with_its_cause() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 3)).await;
    mount(
        &server,
        "PATCH",
        error_body(409, "lease is gone", Some(volcano::codes::OWNERSHIP_LOST)),
    )
    .await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let err = client(&server.uri())
        .locks()
        .with_lock("job", Duration::from_secs(5), |guard| async move {
            guard.lost().await;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    let Error::LockLost(lost) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(lost.reason().to_string(), "renewal failed");
    let text = err.to_string();
    assert_eq!(
        text,
        "lock \"job\" lost: renewal failed: lock conflict (HTTP 409 lock_ownership_lost: lease is gone)"
    );
    // Read once: the cause is in the message, so no source repeats it.
    assert!(std::error::Error::source(&err).is_none());
    assert_eq!(lost.cause().and_then(Error::status), Some(409));
    assert_eq!(err.status(), Some(409));
    assert_eq!(
        LostReason::Expired.to_string(),
        "lease expired (its local deadline passed)"
    );
}

/// A loss before any renewal was due says that the clock jumped, not that
/// a renewal was too slow.
#[tokio::test]
async fn a_loss_before_any_renewal_says_the_clock_jumped() {
    let server = MockServer::start().await;
    let clock = volcano::LeaseClock::adjustable();
    let client = Client::builder()
        .api_url(server.url())
        .service_key(server.service_key())
        .lease_clock(clock.clone())
        .build()
        .unwrap();
    let held = client
        .locks()
        .hold("job", Duration::from_secs(30))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(31));
    assert!(held.is_lost());
    let text = held.failure().unwrap().to_string();
    assert_eq!(
        text,
        "lock \"job\" lost: lease expired (its local deadline passed) (no renewal was due yet: \
         the lease clock jumped past the deadline; the process was suspended or stalled, or \
         LeaseClock::advance moved it)"
    );
}

#[tokio::test]
async fn wait_for_returns_the_journal_entry_once_it_is_recorded() {
    let server = Arc::new(MockServer::start().await);
    server.inject(Fault::status(409).on(Operation::Renew));
    let client = Client::for_mock(&server);
    let waiter = {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .wait_for(Operation::Renew, 409, Duration::from_secs(10))
                .await
        })
    };
    let held = client
        .locks()
        .hold("job", Duration::from_secs(5))
        .await
        .unwrap();
    let rejected = waiter.await.unwrap().expect("the renewal was refused");
    assert_eq!(rejected.operation, Operation::Renew);
    assert_eq!(rejected.status, Some(409));
    assert_eq!(rejected.key, "job");
    held.lost().await;
    // An entry already recorded is returned at once.
    let again = server
        .wait_for(Operation::Renew, 409, Duration::from_millis(1))
        .await;
    assert_eq!(again.map(|r| r.seq), Some(rejected.seq));
    // Nothing matching: None after the timeout.
    let none = server
        .wait_for(Operation::ForceRelease, 200, Duration::from_millis(100))
        .await;
    assert!(none.is_none());
    drop(held);
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
}

/// Only `lock_held` means "held elsewhere": any other 409 on the acquire
/// (here one without a code, as a proxy might send) is an error.
#[tokio::test]
async fn try_with_lock_skips_only_on_lock_held() {
    let server = server().await;
    mount(&server, "POST", error_body(409, "conflict", None)).await;
    let err = client(&server.uri())
        .locks()
        .try_with_lock("job", TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409));
    assert!(!err.is_lock_held());
}
