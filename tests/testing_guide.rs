//! The testing guide's recipe "A 503 in the middle of a job"
//! (docs/testing.md), as the guide shows it: it must pass as written.

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

/// The recipe "Watching who holds a key": a key released and taken again
/// between two looks reads as one `TakenOver` (a free key at the first
/// look would read `Acquired`), and the holder's expiry, moved past on the
/// service's clock, as `Expired` (the lease seen in its grace: a look in
/// its last second may read a `Date` that leaves more than a second, and
/// the end then reads `Ended`; that made this test fail one run in five).
#[tokio::test]
async fn watching_who_holds_a_key() -> Result<(), volcano::Error> {
    use volcano::ChangeKind;
    let server = MockServer::start().await;
    let locks = Client::for_mock(&server).locks();
    let ttl = Duration::from_secs(5);
    let first = locks.acquire("nightly-report", ttl).await?;
    let mut changes = locks
        .observe("nightly-report")
        .poll_interval(Duration::from_millis(100));
    assert_eq!(changes.next().await.unwrap()?.kind(), ChangeKind::Initial);
    locks.release(&first).await?;
    let _again = locks.acquire("nightly-report", ttl).await?;
    server.advance(ttl);
    assert_eq!(changes.next().await.unwrap()?.kind(), ChangeKind::TakenOver);
    server.advance(Duration::from_secs(3));
    assert_eq!(changes.next().await.unwrap()?.kind(), ChangeKind::Expired);
    Ok(())
}
