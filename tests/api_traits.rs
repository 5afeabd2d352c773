//! What a user may do with the public types across tasks and threads,
//! checked when this file compiles: a type that stops being `Send`, `Sync`,
//! `Clone` or `Debug` (a field added that is not) fails the build here, not
//! in a user's program after an upgrade. The futures a user spawns must be
//! `Send`.

use std::fmt::Debug;
use std::time::Duration;

use volcano::*;

fn shared<T: Send + Sync + Debug + 'static>() {}
fn shared_clone<T: Send + Sync + Debug + Clone + 'static>() {}
fn send_future<F: std::future::Future + Send>(_: &F) {}

#[test]
fn handles_and_values_cross_threads() {
    // Handles a program keeps and hands to its tasks.
    shared_clone::<Client>();
    shared_clone::<Locks>();
    shared_clone::<Semaphore>();
    shared_clone::<LeaderHealth>();
    shared::<HeldLock>();
    shared::<HeldLocks>();
    shared::<LockGuard>();
    shared::<LockSet>();
    shared::<Leader>();
    shared::<Observe>();
    shared::<ClientBuilder>();
    shared_clone::<LeaseClock>();
    // Values and reports.
    shared_clone::<LockLease>();
    shared_clone::<LockState>();
    shared_clone::<LockChange>();
    shared_clone::<ChangeKind>();
    shared_clone::<LeaderStatus>();
    shared_clone::<AtRisk>();
    shared_clone::<AcquireOptions>();
    // Errors: `Error` is not `Clone` (a transport error keeps its source).
    shared::<Error>();
    shared::<TransportError>();
    shared_clone::<ApiError>();
    shared_clone::<InvalidResponse>();
    shared_clone::<LockLost>();
    shared_clone::<LostReason>();
    shared_clone::<InvalidReason>();
    // Builders that are stored before they are awaited.
    shared_clone::<Acquire>();
    shared_clone::<Hold>();
    shared_clone::<HoldAll>();
    shared_clone::<AcquirePermit>();
    shared_clone::<Renew>();
    shared_clone::<Get>();
    shared_clone::<Release>();
    shared_clone::<ForceRelease>();
}

#[cfg(feature = "mock")]
#[test]
fn the_mock_crosses_threads() {
    use volcano::mock::*;
    shared::<MockServer>();
    shared_clone::<MockServerBuilder>();
    shared_clone::<Fault>();
    shared_clone::<FaultKind>();
    shared_clone::<Operation>();
    shared_clone::<RecordedRequest>();
    shared_clone::<LockSnapshot>();
    shared_clone::<InvalidFault>();
    shared_clone::<ClockRangeError>();
}

/// Never run: only compiled, so that each future is checked for `Send`.
#[allow(dead_code, clippy::let_underscore_future)]
async fn futures_are_send(client: Client, held: HeldLock, guard: LockGuard) {
    let locks = client.locks();
    let ttl = Duration::from_secs(30);
    send_future(&locks.acquire("k", ttl).send());
    send_future(&locks.hold("k", ttl).send());
    send_future(&locks.get("k").send());
    send_future(
        &locks
            .with_lock("k", ttl, |_| async { Ok::<_, Error>(()) })
            .send(),
    );
    send_future(
        &locks
            .try_with_lock("k", ttl, |_| async { Ok::<_, Error>(()) })
            .send(),
    );
    send_future(
        &locks
            .with_locks(["a", "b"], ttl, |_| async { Ok::<_, Error>(()) })
            .send(),
    );
    send_future(&locks.leader("k", ttl).run(|_| async { Ok::<_, Error>(()) }));
    send_future(
        &locks
            .semaphore("s", 2)
            .with_permit(ttl, |_| async { Ok::<_, Error>(()) })
            .send(),
    );
    let mut changes = locks.observe("k");
    send_future(&changes.next());
    send_future(&guard.lost());
    send_future(&guard.wait_lost(ttl));
    send_future(&held.lost());
    send_future(&client.shutdown(ttl));
    send_future(&held.release());
}
