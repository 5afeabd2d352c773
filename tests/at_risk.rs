//! The early warning before a loss (DESIGN section 15): `at_risk()` while
//! renewals fail transiently and the lease is still ours, cleared by a
//! successful renewal, never for a refusal, never after the loss.

mod common;

use std::time::Duration;

use common::mock_client;
use volcano::{Error, LostReason};
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);

/// Two 503s, then renewals succeed: the risk begins at the first failure
/// (with the 503 as its cause and less than the ttl left) and clears at
/// the success; the lock is never lost.
#[tokio::test]
async fn failing_renewals_put_the_lock_at_risk_and_a_success_clears_it() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew).times(2));
    let client = mock_client(&server);
    let held = client.locks().hold("job", TTL).await.unwrap();
    assert!(held.at_risk().is_none(), "nothing failed yet");

    tokio::time::timeout(Duration::from_secs(4), held.at_risk_changed())
        .await
        .expect("a risk begins at the first 503");
    let risk = held.at_risk().expect("at risk after a 503");
    assert_eq!(risk.key(), "job");
    assert_eq!(risk.cause().status(), Some(503), "{risk}");
    assert!(
        risk.remaining() > Duration::ZERO && risk.remaining() < TTL,
        "{risk}"
    );
    assert!(risk.to_string().contains("at risk"), "{risk}");

    tokio::time::timeout(Duration::from_secs(4), held.at_risk_changed())
        .await
        .expect("a successful renewal ends the risk");
    assert!(held.at_risk().is_none());
    assert!(!held.is_lost(), "{:?}", held.failure());
    held.release().await.unwrap();
}

/// A renewal refused with 409 (another holder took the key): a loss at
/// once, never a risk.
#[tokio::test]
async fn a_refused_renewal_is_a_loss_never_a_risk() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let held = locks.hold("job", TTL).await.unwrap();
    locks.force_release("job").await.unwrap();
    let stolen = locks.acquire("job", TTL).await.unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(4), held.at_risk_changed()).await;
    assert!(changed.is_ok(), "the loss ends the wait for a change");
    assert!(held.is_lost());
    assert_eq!(held.failure().unwrap().reason(), LostReason::RenewalFailed);
    assert!(held.at_risk().is_none());
    locks.release(&stolen).await.unwrap();
    let _ = held.release().await;
}

/// Renewals that keep failing: at risk until the window closes, then
/// lost, and no longer at risk once lost.
#[tokio::test]
async fn a_risk_that_runs_out_ends_in_a_loss_and_clears() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew));
    let client = mock_client(&server);
    let set = client.locks().hold_all(["a", "b"], TTL).await.unwrap();
    tokio::time::timeout(Duration::from_secs(4), set.at_risk_changed())
        .await
        .expect("a key of the set is at risk");
    let risk = set.at_risk().expect("the set reports its key at risk");
    assert_eq!(risk.cause().status(), Some(503));
    assert!(
        tokio::time::timeout(Duration::from_secs(8), set.lost())
            .await
            .is_ok(),
        "lost when no attempt fits"
    );
    assert!(set.at_risk().is_none(), "a lost lock is not at risk");
    let err = set.release().await.unwrap_err();
    assert!(matches!(err, Error::LockLost(_)), "{err:?}");
}

/// `at_risk_changed()` watches from the moment it is called: an episode
/// that begins between reading `at_risk()` and the first poll of the
/// future (the window a `select!` loop has) is not missed. Before, the
/// future subscribed at its first poll and waited for the change after.
#[tokio::test]
async fn a_change_between_reading_and_awaiting_is_not_missed() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew));
    let client = mock_client(&server);
    let held = client.locks().hold("job", TTL).await.unwrap();
    let set = client.locks().hold_all(["a", "b"], TTL).await.unwrap();
    assert!(held.at_risk().is_none() && set.at_risk().is_none());
    let guard_changed = held.at_risk_changed();
    let set_changed = set.at_risk_changed();
    // The episode begins before either future is first polled.
    let began = common::eventually(Duration::from_secs(4), || {
        held.at_risk().is_some() && set.at_risk().is_some()
    })
    .await;
    assert!(began, "the 503s put both at risk");
    tokio::time::timeout(Duration::from_millis(10), guard_changed)
        .await
        .expect("the guard's change was seen");
    tokio::time::timeout(Duration::from_millis(10), set_changed)
        .await
        .expect("the set's change was seen");
    server.clear_faults();
    drop((held, set));
    client.shutdown(Duration::from_secs(5)).await;
}
