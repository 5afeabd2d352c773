//! `locks.hold(key, ttl)` and `HeldLock`: a renewing lock outside any
//! closure, against the mock server.

mod common;

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use volcano::{Error, HeldLock, LostReason};
use volcano_mock_server::{MockServer, Operation};

const KEY: &str = "ingest";
const TTL: Duration = Duration::from_secs(5);

fn held_on_server(server: &MockServer) -> Option<i64> {
    server
        .locks()
        .into_iter()
        .find(|l| l.key == KEY && l.live)
        .map(|l| l.fencing_token)
}

fn renewals(server: &MockServer) -> Vec<Option<u16>> {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Renew)
        .map(|r| r.status)
        .collect()
}

#[test]
fn a_held_lock_can_live_in_a_struct_or_an_arc_across_tasks() {
    fn assert_send_sync_static<T: Send + Sync + 'static>() {}
    assert_send_sync_static::<HeldLock>();
    assert_send_sync_static::<Arc<HeldLock>>();
}

#[tokio::test]
async fn a_held_lock_renews_in_the_background_until_released() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // The hold future is Send + 'static: it can be spawned.
    let held = tokio::spawn(client.locks().hold(KEY, TTL).into_future())
        .await
        .unwrap()
        .unwrap();
    let fence = held.lease().fencing_token();
    assert_eq!(held_on_server(&server), Some(fence));
    assert_eq!(client.active_renewals(), 1);

    // ttl 5 s renews about every 1.7 s.
    let renewed = || renewals(&server).contains(&Some(200));
    assert!(eventually(Duration::from_secs(5), renewed).await);
    assert!(!held.is_lost());
    assert!(!*held.watch().borrow());

    let guard = volcano::LockGuard::clone(&held);
    held.release().await.unwrap();
    assert_eq!(held_on_server(&server), None);
    assert_eq!(client.active_renewals(), 0);
    assert_eq!(
        guard.failure().map(|l| l.reason()),
        Some(LostReason::Released)
    );
}

#[tokio::test]
async fn dropping_a_held_lock_stops_renewing_and_releases_in_the_background() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let held = client.locks().hold(KEY, TTL).await.unwrap();
    assert!(held_on_server(&server).is_some());
    drop(held);
    assert_eq!(
        client.shutdown(Duration::from_secs(10)).await,
        Vec::<String>::new()
    );
    assert_eq!(held_on_server(&server), None);
    assert_eq!(client.active_renewals(), 0);
}

#[tokio::test]
async fn a_lost_held_lock_says_so_and_release_reports_the_loss() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let held = Arc::new(client.locks().hold(KEY, TTL).await.unwrap());
    // An admin force-releases the key; the next renewal is refused.
    client.locks().force_release(KEY).await.unwrap();
    let watcher = tokio::spawn({
        let held = held.clone();
        async move { held.lost().await }
    });
    tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("lost() resolves once the renewal is refused")
        .unwrap();
    assert_eq!(
        held.failure().map(|l| l.reason()),
        Some(LostReason::RenewalFailed)
    );
    assert_eq!(renewals(&server).last(), Some(&Some(409)));

    let held = Arc::into_inner(held).expect("the watcher is done");
    let err = held.release().await.unwrap_err();
    assert!(err.is_ownership_lost(), "{err:?}");
    assert!(matches!(err, Error::LockLost(_)), "{err:?}");
}

#[tokio::test]
async fn hold_waits_for_a_held_lock_and_recovers_with_the_callers_token() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let first = locks.acquire(KEY, TTL).await.unwrap();
    let err = locks.hold(KEY, TTL).await.unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");

    let waiting = tokio::spawn(
        locks
            .hold(KEY, TTL)
            .wait(Duration::from_secs(10))
            .into_future(),
    );
    locks.release(&first).await.unwrap();
    let held = waiting.await.unwrap().unwrap();
    assert!(held.lease().fencing_token() > first.fencing_token());
    held.release().await.unwrap();

    // A worker that restarts with its own token picks its lease up again.
    let token = uuid::Uuid::new_v4().to_string();
    let held = locks.hold(KEY, TTL).token(token.clone()).await.unwrap();
    let fence = held.lease().fencing_token();
    std::mem::forget(held); // a crash: no release, no task
    let again = locks.hold(KEY, TTL).token(token).await.unwrap();
    assert_eq!(again.lease().fencing_token(), fence);
    again.release().await.unwrap();
    assert_eq!(held_on_server(&server), None);
}
