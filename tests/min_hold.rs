//! A minimum hold (DESIGN section 15): a job that ends early keeps its
//! lock until `min_hold` after it was acquired; never past a loss, a
//! panic or `max_hold`, and a dropped future releases at once.

mod common;

use std::time::{Duration, Instant};

use common::mock_client;
use volcano::Error;
use volcano_mock_server::{MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);
const MIN: Duration = Duration::from_secs(6);

fn live(server: &MockServer, key: &str) -> bool {
    server.locks().iter().any(|l| l.key == key && l.live)
}

/// A job that returns at once keeps the lock (renewed, not released) until
/// the minimum has passed; another worker meanwhile skips.
#[tokio::test]
async fn a_job_that_ends_early_keeps_the_lock_until_the_minimum() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let started = Instant::now();
    let first = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .try_with_lock("report", TTL, |_guard| async move {
                    let _ = done_tx.send(());
                    Ok::<_, Error>(7)
                })
                .min_hold(MIN)
                .await
        }
    });
    done.await.unwrap();
    // The job is over; the lock is still held, and another run skips.
    let other = locks
        .try_with_lock("report", TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap();
    assert_eq!(other, None, "held during the minimum");
    assert_eq!(first.await.unwrap().unwrap(), Some(7));
    assert!(started.elapsed() >= MIN, "{:?}", started.elapsed());
    assert!(!live(&server, "report"), "released after the minimum");
    let renewed = server
        .requests()
        .iter()
        .any(|r| r.operation == Operation::Renew && r.status == Some(200));
    assert!(renewed, "renewed while kept past its ttl");
}

/// A minimum longer than the maximum: refused before anything is sent.
#[tokio::test]
async fn a_minimum_longer_than_the_maximum_is_refused() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let err = locks
        .with_lock("report", TTL, |_guard| async { Ok::<_, Error>(()) })
        .max_hold(Duration::from_secs(5))
        .min_hold(MIN)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("min_hold"), "{err}");
    assert!(server.requests().is_empty());
}

/// Another holder during the minimum (a force release, then an acquire):
/// the minimum ends, and the outcome says the lock was lost, since when
/// the key was taken cannot be told.
#[tokio::test]
async fn a_takeover_during_the_minimum_is_reported() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let job = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .with_lock("report", TTL, |_guard| async move {
                    let _ = done_tx.send(());
                    Ok::<_, Error>(())
                })
                .min_hold(Duration::from_secs(60))
                .await
        }
    });
    done.await.unwrap();
    locks.force_release("report").await.unwrap();
    let stolen = locks.acquire("report", TTL).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), job)
        .await
        .expect("the minimum ends at the loss")
        .unwrap();
    let err = ended.unwrap_err();
    assert!(matches!(err, Error::LockLost(_)), "{err:?}");
    locks.release(&stolen).await.unwrap();
}

/// A panic is not held back, and a dropped future releases at once.
#[tokio::test]
async fn a_panic_or_a_drop_releases_at_once() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let started = Instant::now();
    let panicked = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .with_lock("report", TTL, |_guard| async move {
                    panic!("the job failed");
                    #[allow(unreachable_code)]
                    Ok::<_, Error>(())
                })
                .min_hold(Duration::from_secs(60))
                .await
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!live(&server, "report"), "released at the panic");

    let (done_tx, done) = tokio::sync::oneshot::channel();
    let kept = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .with_lock("report", TTL, |_guard| async move {
                    let _ = done_tx.send(());
                    Ok::<_, Error>(())
                })
                .min_hold(Duration::from_secs(60))
                .await
        }
    });
    done.await.unwrap();
    kept.abort();
    let _ = kept.await;
    let freed = server.wait_for(Operation::Release, 204, Duration::from_secs(5));
    assert!(
        freed.await.is_some(),
        "released when dropped: {:?}",
        server.requests()
    );
}
