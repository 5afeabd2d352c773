//! A minimum hold (DESIGN section 16): a job that ends early returns at
//! once, and the service keeps the key until `min_hold` after it was
//! acquired (one renewal to the minimum's end, no release), even with the
//! process's client shut down; never past a loss, a panic or `max_hold`,
//! and a dropped future releases at once.

mod common;

use std::time::{Duration, Instant};

use common::{live_on as live, mock_client};
use volcano::Error;
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);
const MIN: Duration = Duration::from_secs(6);

fn count(server: &MockServer, operation: Operation) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == operation)
        .count()
}

/// How long after `began` the lease of "report" expires on the server.
fn kept_since(server: &MockServer, began: chrono::DateTime<chrono::Utc>) -> Duration {
    let lock = server
        .locks()
        .into_iter()
        .find(|l| l.key == "report")
        .unwrap();
    (lock.expires_at - began).to_std().unwrap()
}

/// A second worker's try: whether it ran.
async fn another_runs(server: &MockServer) -> bool {
    let other = mock_client(server);
    let ran = other
        .locks()
        .try_with_lock("report", TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap();
    other.shutdown(Duration::from_secs(5)).await;
    ran.is_some()
}

/// A job that returns at once returns at once: one renewal sets the
/// lease's expiry to the minimum's end, nothing is released, and the key
/// stays held (with the job's client shut down) until then, free no later
/// than a second after it; a second worker skips meanwhile. The server's
/// clock is moved, not waited for.
#[tokio::test]
async fn a_job_that_ends_early_returns_and_the_service_keeps_the_key() {
    const MINIMUM: Duration = Duration::from_secs(60);
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let began = server.now();
    let ran = tokio::time::timeout(
        Duration::from_secs(10),
        client
            .locks()
            .try_with_lock("report", TTL, |_guard| async move { Ok::<_, Error>(7) })
            .min_hold(MINIMUM)
            .send(),
    )
    .await
    .expect("returns once the job has ended, not after the minimum");
    assert_eq!(ran.unwrap(), Some(7));
    assert_eq!(
        client.shutdown(Duration::from_secs(5)).await,
        Vec::<String>::new()
    );
    drop(client);
    assert_eq!(count(&server, Operation::Acquire), 1);
    assert_eq!(
        count(&server, Operation::Renew),
        1,
        "{:?}",
        server.requests()
    );
    assert_eq!(count(&server, Operation::Release), 0, "nothing released");
    let kept = kept_since(&server, began);
    assert!(
        kept >= MINIMUM && kept <= MINIMUM + Duration::from_secs(2),
        "kept {kept:?} after the job began"
    );
    assert!(!another_runs(&server).await, "a second worker skips");
    server.advance(MINIMUM - Duration::from_secs(2));
    assert!(
        !another_runs(&server).await,
        "still kept near the minimum's end"
    );
    // The minimum's end, the rounding to a whole second and the service's
    // second of grace.
    server.advance(Duration::from_secs(2) + Duration::from_secs(2));
    assert!(another_runs(&server).await, "free after the minimum");
}

/// The keeping renewal answered 503 is tried again within the lease's
/// window: the minimum is kept.
#[tokio::test]
async fn a_keeping_renewal_that_fails_once_is_retried() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(Fault::status(503).on(Operation::Renew).times(1));
    let ran = client
        .locks()
        .try_with_lock("report", TTL, |_guard| async move { Ok::<_, Error>(()) })
        .min_hold(Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(ran, Some(()));
    let renewals: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.operation == Operation::Renew)
        .map(|r| r.status)
        .collect();
    assert_eq!(renewals, [Some(503), Some(200)]);
    assert!(live(&server, "report"));
    assert_eq!(count(&server, Operation::Release), 0);
}

/// A keeping renewal that cannot be made (the service fails every renewal
/// until the lease's deadline): the job's outcome stands, the minimum is
/// not kept, and the lease ends at its last expiry. (Real time: the
/// lease's 5 s.)
#[tokio::test]
async fn a_minimum_that_cannot_be_kept_leaves_the_outcome_and_the_lease_ends() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(Fault::status(503).on(Operation::Renew));
    let ran = client
        .locks()
        .try_with_lock("report", TTL, |_guard| async move { Ok::<_, Error>(3) })
        .min_hold(Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(ran, Some(3), "the work was covered");
    assert!(count(&server, Operation::Renew) >= 2);
    assert_eq!(count(&server, Operation::Release), 0);
    server.clear_faults();
    server.advance(TTL + Duration::from_secs(2));
    assert!(!live(&server, "report"), "ends at its last expiry");
}

/// A minimum already passed when the job ends: released as without one.
#[tokio::test]
async fn a_minimum_already_passed_releases() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let ran = locks
        .try_with_lock("report", TTL, |_guard| async move {
            // The protocol's seconds: a minimum of one, waited for.
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            Ok::<_, Error>(())
        })
        .min_hold(Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(ran, Some(()));
    assert_eq!(count(&server, Operation::Release), 1);
    assert!(!live(&server, "report"));
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

/// A minimum as long as `max_hold` is kept to the cap, never past it: the
/// keeping renewal asks for the cap's whole seconds left (6 s of 6.5 s),
/// not the minimum's rounded up (7 s).
#[tokio::test]
async fn a_keep_never_outlives_max_hold() {
    const CAP: Duration = Duration::from_millis(6_500);
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let began = server.now();
    client
        .locks()
        .with_lock("report", TTL, |_guard| async { Ok::<_, Error>(()) })
        .min_hold(CAP)
        .max_hold(CAP)
        .await
        .unwrap();
    assert_eq!(
        count(&server, Operation::Renew),
        1,
        "{:?}",
        server.requests()
    );
    let kept = kept_since(&server, began);
    assert!(
        kept >= Duration::from_secs(5) && kept <= CAP,
        "kept {kept:?} after the job began, under a cap of {CAP:?}"
    );
    client.shutdown(Duration::from_secs(5)).await;
}

/// Another holder took the key while the job ran, unseen by the renewals
/// (a force release, then an acquire): the keeping renewal is answered
/// 409, and the outcome says the lock was lost, since when the key was
/// taken cannot be told.
#[tokio::test]
async fn a_takeover_before_the_minimum_is_kept_is_reported() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let thief = mock_client(&server).locks();
    let ended = locks
        .with_lock("report", TTL, |_guard| async move {
            thief.force_release("report").await?;
            let stolen = thief.acquire("report", TTL).await?;
            Ok::<_, Error>(stolen)
        })
        .min_hold(Duration::from_secs(60))
        .await;
    let err = ended.unwrap_err();
    assert!(matches!(err, Error::LockLost(_)), "{err:?}");
    assert_eq!(count(&server, Operation::Release), 0);
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

/// `HeldLock::release_reporting` says what became of the minimum: kept by
/// the service (the key held to its end), passed already, not asked, or
/// not kept when the renewal that keeps it fails (the key is then free at
/// the lease's last expiry). Each with the same requests as `release`.
#[tokio::test]
async fn release_reporting_says_whether_the_minimum_is_kept() {
    use volcano::MinHold;
    const MINIMUM: Duration = Duration::from_secs(60);
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let held = locks.hold("kept", TTL).min_hold(MINIMUM).await.unwrap();
    assert_eq!(held.release_reporting().await.unwrap(), MinHold::Kept);
    assert!(live(&server, "kept"));
    let held = locks.hold("plain", TTL).await.unwrap();
    assert_eq!(held.release_reporting().await.unwrap(), MinHold::NotAsked);
    assert!(!live(&server, "plain"));
    let held = locks
        .hold("short", TTL)
        .min_hold(Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(held.release_reporting().await.unwrap(), MinHold::Passed);
    assert!(!live(&server, "short"));

    // Under a cap far from the minimum's end: kept all the same.
    let capped = volcano::AcquireOptions::default().max_hold(Duration::from_secs(600));
    let held = locks
        .hold("capped", TTL)
        .options(capped)
        .min_hold(MINIMUM)
        .await
        .unwrap();
    assert_eq!(held.release_reporting().await.unwrap(), MinHold::Kept);
    assert!(live(&server, "capped"));

    server.inject(Fault::status(503).on(Operation::Renew).key("failing"));
    let held = locks.hold("failing", TTL).min_hold(MINIMUM).await.unwrap();
    assert_eq!(held.release_reporting().await.unwrap(), MinHold::NotKept);
    assert_eq!(
        count(&server, Operation::Release),
        2,
        "plain and short only"
    );
    client.shutdown(Duration::from_secs(5)).await;
}

/// The lease taken away (a force release) and the key taken again under
/// the same token (what a late try of the acquire does): the keep then
/// renews another lease, with another fencing token. The minimum is not
/// kept, the loss is a takeover, and that lease (nobody's work) is
/// released.
#[tokio::test]
async fn a_keep_that_finds_the_key_taken_again_under_its_token_is_a_takeover() {
    use volcano::{AcquireOptions, LostReason};
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let again = |token: String| AcquireOptions::default().token(token);

    // The keep.
    let held = locks
        .hold("kept", TTL)
        .min_hold(Duration::from_secs(60))
        .await
        .unwrap();
    let (token, fence) = (
        held.lease().token().to_owned(),
        held.lease().fencing_token(),
    );
    locks.force_release("kept").await.unwrap();
    let stranger = locks
        .acquire("kept", TTL)
        .options(again(token))
        .await
        .unwrap();
    assert!(stranger.fencing_token() > fence);
    match held.release_reporting().await {
        Err(Error::LockLost(lost)) => assert_eq!(lost.reason(), LostReason::TakenOver, "{lost}"),
        other => panic!("the minimum kept on another lease: {other:?}"),
    }
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    assert!(!live(&server, "kept"), "the late lease is released");
}
