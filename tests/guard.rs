//! Scoped locks end to end against the stateful mock server: faults
//! survived, losses noticed in time, and release on every exit.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, mock_client};
use volcano::{Error, LostReason};
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);

fn renewals(server: &MockServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Renew && r.status == Some(200))
        .count()
}

#[tokio::test]
async fn a_503_and_a_dropped_renewal_answer_are_survived_without_loss() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew).times(1));
    server.inject(Fault::drop_response().on(Operation::Renew).times(1));
    let client = mock_client(&server);
    let srv = &server;
    let fence = client
        .locks()
        .with_lock("job", TTL, |guard| async move {
            // The first renewal gets a 503, its retry is applied but its
            // answer dropped, the next retry succeeds; then one more.
            let renewed = eventually(Duration::from_secs(8), || renewals(srv) >= 3).await;
            assert!(renewed, "journal: {:?}", srv.requests());
            assert!(!guard.is_lost(), "{:?}", guard.failure());
            Ok::<_, Error>(guard.lease().fencing_token())
        })
        .await
        .unwrap();
    assert_eq!(fence, 1);
    assert!(server.locks().is_empty(), "released");
    assert_eq!(client.active_renewals(), 0);
    let faults: Vec<_> = server.requests().iter().filter_map(|r| r.fault).collect();
    assert_eq!(faults.len(), 2, "both faults were hit");
}

#[tokio::test]
async fn a_rejected_renewal_marks_the_guard_lost_within_one_renewal_period() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let admin = &locks;
    let err = locks
        .with_lock("job", TTL, |guard| async move {
            let locks = admin;
            locks.force_release("job").await?;
            let stolen = locks.acquire("job", TTL).await?;
            let started = tokio::time::Instant::now();
            // Renewal period for ttl 5 is about 1.67 s (+10 % jitter).
            assert!(guard.wait_lost(Duration::from_secs(3)).await);
            assert!(
                started.elapsed() < Duration::from_millis(2_500),
                "{:?}",
                started.elapsed()
            );
            let failure = guard.failure().unwrap();
            assert_eq!(failure.reason(), LostReason::RenewalFailed);
            assert!(failure.cause().unwrap().is_ownership_lost());
            locks.release(&stolen).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LockLost(_)), "{err:?}");
    assert!(err.is_ownership_lost());
}

#[tokio::test]
async fn the_guard_reports_a_stalled_renewal_before_the_server_expires_the_lease() {
    let server = MockServer::start().await;
    server.inject(Fault::delay(Duration::from_secs(30)).on(Operation::Renew));
    let srv = &server;
    let err = mock_client(&server)
        .locks()
        .with_lock("job", TTL, |guard| async move {
            let server = srv;
            let server_expiry = server.locks()[0].expires_at;
            guard.lost().await;
            let margin = server_expiry - server.now();
            eprintln!("guard reported the loss {margin} before the server's expiry");
            assert!(
                margin > chrono::TimeDelta::zero(),
                "guard reported {margin} before the server's expiry"
            );
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    match err {
        Error::LockLost(lost) => assert_eq!(lost.reason(), LostReason::Expired),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dropping_the_future_stops_renewal_and_releases() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let locks = client.locks();
    let task = tokio::spawn(async move {
        locks
            .with_lock("job", TTL, |_guard| async move {
                let _ = started_tx.send(());
                std::future::pending::<Result<(), Error>>().await
            })
            .await
    });
    started_rx.await.unwrap();
    assert_eq!(server.locks().len(), 1);
    assert_eq!(client.active_renewals(), 1);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(
        eventually(Duration::from_secs(5), || server.locks().is_empty()).await,
        "the best-effort release ran"
    );
    assert!(eventually(Duration::from_secs(1), || client.active_renewals() == 0).await);
}

#[tokio::test]
async fn a_panic_in_the_closure_releases_then_continues() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let task = tokio::spawn(async move {
        locks
            .with_lock("job", TTL, |_guard| async move {
                if true {
                    panic!("job exploded");
                }
                Ok::<_, Error>(())
            })
            .await
    });
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    let message = err.into_panic();
    assert_eq!(message.downcast_ref::<&str>(), Some(&"job exploded"));
    assert!(
        server.locks().is_empty(),
        "released before the panic continued"
    );
    assert_eq!(client.active_renewals(), 0);
    let ops: Vec<_> = server.requests().iter().map(|r| r.operation).collect();
    assert_eq!(ops, [Operation::Acquire, Operation::Release]);
}

#[tokio::test]
async fn cancel_on_loss_drops_the_closure_and_returns_lock_lost() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let dropped = Arc::new(AtomicBool::new(false));
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let flag = SetOnDrop(dropped.clone());
    let admin = locks.clone();
    let err = locks
        .with_lock("job", TTL, |_guard| async move {
            let _flag = flag;
            admin.force_release("job").await?;
            std::future::pending::<Result<(), Error>>().await
        })
        .cancel_on_loss()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LockLost(_)), "{err:?}");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the closure's future was dropped"
    );
}

#[tokio::test]
async fn two_workers_one_lock() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_lock("report", TTL, |guard| async move {
                    let _ = held_tx.send(guard.lease().fencing_token());
                    let _ = done_rx.await;
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    let fence = held_rx.await.unwrap();
    let err = locks
        .with_lock("report", TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    done_tx.send(()).unwrap();
    first.await.unwrap().unwrap();
    let second = locks
        .with_lock("report", TTL, |guard| async move {
            Ok::<_, Error>(guard.lease().fencing_token())
        })
        .await
        .unwrap();
    assert!(second > fence);
}

/// A renewal refused with a `Retry-After` longer than the window left is
/// tried once more at the end of the window rather than given up with
/// time left: ttl 5 s, the first renewal (at about 1.7 s) answered 503 with
/// `Retry-After: 3`, the next one accepted.
#[tokio::test]
async fn a_retry_after_longer_than_the_window_still_gets_a_last_renewal_in_it() {
    use wiremock::matchers::method;
    use wiremock::{Mock, ResponseTemplate};
    let wire = common::server().await;
    Mock::given(method("POST"))
        .respond_with(common::lease_body(201, 3))
        .mount(&wire)
        .await;
    common::unavailable_then(&wire, "PATCH", 1, 3, common::lease_body(200, 3)).await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&wire)
        .await;
    let client = common::client(&wire.uri());
    let held = client.locks().hold("job", TTL).await.unwrap();
    let patches = || async {
        common::received(&wire)
            .await
            .iter()
            .filter(|r| r.method.as_str() == "PATCH")
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while patches().await < 2 && tokio::time::Instant::now() < deadline && !held.is_lost() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!held.is_lost(), "lost: {:?}", held.failure());
    assert_eq!(patches().await, 2, "the second renewal was sent");
    held.release().await.unwrap();
}

/// Ttl 5 s (the mock's whole-second `Date` leaves a window of 3 to 4 s
/// after the acquire), renewals answered 503 three times in a row: the
/// fourth is accepted, sent at the end of the window if the backoff would
/// have run past it.
#[tokio::test]
async fn three_503s_in_a_row_are_survived_with_a_5_s_ttl() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew).times(3));
    let client = mock_client(&server);
    let held = client.locks().hold("job", TTL).await.unwrap();
    let renewed = server.wait_for(Operation::Renew, 200, Duration::from_secs(6));
    assert!(renewed.await.is_some(), "journal: {:?}", server.requests());
    assert!(!held.is_lost(), "lost: {:?}", held.failure());
    held.release().await.unwrap();
}

/// Renewals that keep being refused with 503 until no attempt fits the
/// window: the loss is `RenewalFailed` with the last answer as its cause
/// (`Expired` is for no answer before the deadline).
#[tokio::test]
async fn renewals_refused_until_the_window_closes_are_renewal_failed_with_the_last_answer() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew));
    let client = mock_client(&server);
    let held = client.locks().hold("job", TTL).await.unwrap();
    assert!(held.wait_lost(Duration::from_secs(8)).await);
    let lost = held.failure().unwrap();
    assert_eq!(lost.reason(), LostReason::RenewalFailed, "{lost}");
    assert_eq!(lost.cause().and_then(Error::status), Some(503), "{lost}");
    // The last attempt was sent late in the window, not given up early.
    let last = server
        .requests()
        .into_iter()
        .rfind(|r| r.operation == Operation::Renew)
        .unwrap();
    let acquired = server.requests()[0].at;
    let at = (last.at - acquired).to_std().unwrap();
    assert!(
        at >= Duration::from_millis(2_400),
        "last renewal {at:?} after the acquire"
    );
    let _ = held.release().await;
}
