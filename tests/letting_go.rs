//! Every path that lets go of a lease tells the truth about it, against the
//! mock server:
//! - a release that is refused (`403`, say after a key rotation) is never
//!   dropped: whoever let go (a set that could not be completed, a scope
//!   whose closure failed, a leader's lost term), `Client::shutdown` names
//!   the key while the lease may still be live;
//! - a release answered "another token holds the lock" while the lease
//!   should still have been ours proves the lock was taken while held: the
//!   scope, the held lock and the set report `LostReason::TakenOver`.

mod common;

use std::time::Duration;

use common::mock_client;
use volcano::{Error, LostReason};
use volcano_mock_server::{Fault, MockServer, Operation};

/// Long enough that no renewal is due while a test runs.
const TTL: Duration = Duration::from_secs(60);

fn live(server: &MockServer, key: &str) -> bool {
    server.locks().iter().any(|l| l.key == key && l.live)
}

/// The next release of `key` is refused with 403, without being applied.
fn refuse_release_of(server: &MockServer, key: &str) {
    server.inject(Fault::status(403).on(Operation::Release).key(key).times(1));
}

/// The next acquire of `key` is refused with 403, without being applied.
fn refuse_acquire_of(server: &MockServer, key: &str) {
    server.inject(Fault::status(403).on(Operation::Acquire).key(key).times(1));
}

#[derive(Debug)]
enum JobError {
    Lock(Error),
    Job,
}

impl From<Error> for JobError {
    fn from(err: Error) -> Self {
        JobError::Lock(err)
    }
}

#[tokio::test]
async fn a_set_that_cannot_be_completed_reports_a_refused_release_at_shutdown() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let other = mock_client(&server)
        .locks()
        .acquire("b", TTL)
        .await
        .unwrap();
    refuse_release_of(&server, "a");
    let err = client
        .locks()
        .hold_all(["a", "b"], TTL)
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    assert!(live(&server, "a"), "the refused release left a held");
    let unreleased = client.shutdown(Duration::from_secs(1)).await;
    assert_eq!(unreleased, ["a"], "shutdown names the lease left held");
    drop(other);
}

#[tokio::test]
async fn a_scope_whose_closure_failed_reports_a_refused_release_at_shutdown() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    refuse_release_of(&server, "job");
    let err = client
        .locks()
        .with_lock("job", TTL, |_guard| async { Err::<(), _>(JobError::Job) })
        .await
        .unwrap_err();
    if let JobError::Lock(err) = err {
        panic!("the closure's error wins, not the lock's: {err}");
    }
    assert!(live(&server, "job"));
    assert_eq!(client.shutdown(Duration::from_secs(1)).await, ["job"]);
}

#[tokio::test]
async fn a_set_scope_whose_closure_failed_reports_a_refused_release_at_shutdown() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    refuse_release_of(&server, "b");
    let err = client
        .locks()
        .with_locks(["a", "b"], TTL, |_set| async {
            Err::<(), _>(JobError::Job)
        })
        .await
        .unwrap_err();
    if let JobError::Lock(err) = err {
        panic!("the closure's error wins, not the lock's: {err}");
    }
    assert!(!live(&server, "a") && live(&server, "b"));
    assert_eq!(client.shutdown(Duration::from_secs(1)).await, ["b"]);
}

#[tokio::test]
async fn a_leaders_lost_term_reports_a_refused_release_at_shutdown() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    refuse_release_of(&server, "leader");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (second, mut campaigning) = tokio::sync::mpsc::unbounded_channel::<()>();
    let locks = client.locks();
    let leader = tokio::spawn(async move {
        let mut terms = 0;
        locks
            .leader("leader", TTL)
            .until(async {
                let _ = stopped.await;
            })
            .run(move |term| {
                terms += 1;
                let _ = second.send(());
                async move {
                    // The first term gives up its leadership; the release
                    // of its lease is refused.
                    if terms == 1 {
                        term.mark_lost("the term's own check failed");
                    }
                    std::future::pending::<Result<(), Error>>().await
                }
            })
            .await
    });
    campaigning.recv().await.unwrap();
    // The lost term's release was refused: its lease stays, so the next
    // campaign waits, and shutdown names the key meanwhile.
    let refused = server
        .wait_for(Operation::Release, 403, Duration::from_secs(10))
        .await;
    assert!(refused.is_some(), "the term's release was sent and refused");
    // The next campaign starts once the term has ended: its first try
    // finds the lease the refused release left.
    let next = server
        .wait_for(Operation::Acquire, 409, Duration::from_secs(10))
        .await;
    assert!(next.is_some(), "campaigning again");
    assert!(live(&server, "leader"));
    assert_eq!(client.shutdown(Duration::from_secs(1)).await, ["leader"]);
    stop.send(()).unwrap();
    leader.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_release_refused_once_by_a_held_lock_is_reported_and_its_error_returned() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let held = client.locks().hold("ingest", TTL).await.unwrap();
    refuse_release_of(&server, "ingest");
    let err = held.release().await.unwrap_err();
    assert_eq!(err.status(), Some(403), "{err:?}");
    assert_eq!(client.shutdown(Duration::from_secs(1)).await, ["ingest"]);
    // Recovering the lease (acquiring again with its token) is not possible
    // here (the token was generated), but a transient failure is retried:
    // a 503 on the release is not a refusal.
    let held = client.locks().hold("other", TTL).await.unwrap();
    server.inject(
        Fault::status(503)
            .on(Operation::Release)
            .key("other")
            .times(1),
    );
    held.release().await.unwrap();
    assert!(!live(&server, "other"));
}

/// Someone force-releases the lock and another worker takes it before the
/// first renewal (a 60 s ttl): only the final release can tell.
async fn take_over(server: &MockServer, key: &str) -> volcano::LockLease {
    let other = mock_client(server).locks();
    other.force_release(key).await.unwrap();
    other.acquire(key, TTL).await.unwrap()
}

#[tokio::test]
async fn a_scope_whose_lock_was_taken_over_reports_the_loss() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let server_ref = &server;
    let err = client
        .locks()
        .with_lock("report", TTL, |guard| async move {
            take_over(server_ref, "report").await;
            assert!(!guard.is_lost(), "no renewal has run yet: it cannot know");
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    match err {
        Error::LockLost(lost) => {
            assert_eq!(lost.reason(), LostReason::TakenOver);
            assert!(
                lost.cause().is_some_and(Error::is_ownership_lost),
                "{lost:?}"
            );
        }
        other => panic!("expected a loss, got {other:?}"),
    }
    assert!(
        live(&server, "report"),
        "the other worker's lease is untouched"
    );
    assert!(client.shutdown(Duration::from_secs(1)).await.is_empty());
}

#[tokio::test]
async fn a_held_lock_and_a_set_whose_lock_was_taken_over_report_the_loss() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let held = client.locks().hold("one", TTL).await.unwrap();
    take_over(&server, "one").await;
    let err = held.release().await.unwrap_err();
    assert!(
        matches!(&err, Error::LockLost(l) if l.reason() == LostReason::TakenOver),
        "{err:?}"
    );

    let set = client.locks().hold_all(["x", "y"], TTL).await.unwrap();
    take_over(&server, "y").await;
    let err = set.release().await.unwrap_err();
    assert!(
        matches!(&err, Error::LockLost(l) if l.reason() == LostReason::TakenOver && l.key() == "y"),
        "{err:?}"
    );
    assert!(!live(&server, "x") && live(&server, "y"));
    assert!(client.shutdown(Duration::from_secs(1)).await.is_empty());
}

#[tokio::test]
async fn a_plain_release_of_a_held_lock_is_not_a_loss() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let held = client.locks().hold("calm", TTL).await.unwrap();
    held.release().await.unwrap();
    let ran = client
        .locks()
        .with_lock("calm", TTL, |_guard| async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(ran, 1);
    assert!(client.shutdown(Duration::from_secs(1)).await.is_empty());
}

#[tokio::test]
async fn a_release_answered_409_only_after_a_retry_is_said_as_a_conflict() {
    // The first attempt was refused for the quota (not applied); by the
    // second, another token held the lock. The lease may have lapsed in
    // that pause, after the work: not proof that the work ran without it.
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let held = client.locks().hold("late", TTL).await.unwrap();
    take_over(&server, "late").await;
    server.inject(
        Fault::status(429)
            .on(Operation::Release)
            .key("late")
            .times(1),
    );
    let err = held.release().await.unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    assert!(
        live(&server, "late"),
        "the other worker's lease is untouched"
    );
    assert!(client.shutdown(Duration::from_secs(1)).await.is_empty());
}

/// A caller's own token, so that its lease can be recovered.
const TOKEN: &str = "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10";

#[tokio::test]
async fn a_failed_release_of_a_callers_token_is_forgotten_once_an_acquire_with_it_is_answered() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let held = client.locks().hold("mine", TTL).token(TOKEN).await.unwrap();
    refuse_release_of(&server, "mine");
    held.release().await.unwrap_err();
    // An acquire with the token that is refused says nothing of the lease.
    refuse_acquire_of(&server, "mine");
    let err = client
        .locks()
        .acquire("mine", TTL)
        .token(TOKEN)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(403), "{err:?}");
    // One that is answered recovers it: nothing is left behind once it is
    // released.
    let held = client.locks().hold("mine", TTL).token(TOKEN).await.unwrap();
    held.release().await.unwrap();
    assert!(client.shutdown(Duration::from_secs(1)).await.is_empty());

    // The same story, with the refused acquire last: the key is named.
    let client = mock_client(&server);
    let held = client
        .locks()
        .hold("again", TTL)
        .token(TOKEN)
        .await
        .unwrap();
    refuse_release_of(&server, "again");
    held.release().await.unwrap_err();
    refuse_acquire_of(&server, "again");
    client
        .locks()
        .acquire("again", TTL)
        .token(TOKEN)
        .await
        .unwrap_err();
    assert_eq!(client.shutdown(Duration::from_secs(1)).await, ["again"]);
}
