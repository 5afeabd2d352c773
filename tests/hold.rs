//! `locks.hold(key, ttl)` and `HeldLock`: a renewing lock outside any
//! closure, against the mock server.

mod common;

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use volcano::{Client, Error, HeldLock, LeaseClock, LostReason};
use volcano_mock_server::{Fault, MockServer, Operation};

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
    #[allow(clippy::mem_forget)] // a crash: no release
    std::mem::forget(held);
    let again = locks.hold(KEY, TTL).token(token).await.unwrap();
    assert_eq!(again.lease().fencing_token(), fence);
    again.release().await.unwrap();
    assert_eq!(held_on_server(&server), None);
}

/// A client for the mock server whose locks use `clock`, with a request
/// timeout long enough not to matter.
fn client_on(server: &MockServer, clock: &LeaseClock) -> Client {
    Client::builder()
        .service_key(server.service_key())
        .api_url(server.url())
        .timeout(Duration::from_secs(120))
        .lease_clock(clock.clone())
        .build()
        .unwrap()
}

/// Guards do not look at their deadline on a timer: a sleeping renewal task
/// must be woken by the jump itself (a suspend, here an advance).
#[tokio::test]
async fn a_clock_jump_wakes_a_sleeping_guard_at_once() {
    let server = MockServer::start().await;
    let clock = LeaseClock::adjustable();
    let client = client_on(&server, &clock);
    // ttl 300 s: the next renewal is about a minute away.
    let held = client
        .locks()
        .hold(KEY, Duration::from_secs(300))
        .await
        .unwrap();
    let mut watch = held.watch();
    clock.advance(Duration::from_secs(301));
    // Nobody reads the guard: only the renewal task can flip the channel.
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the loss is announced at once, not at the next renewal")
        .unwrap();
    assert_eq!(held.failure().unwrap().reason(), LostReason::Expired);
    assert!(eventually(Duration::from_secs(5), || client.active_renewals() == 0).await);
    assert!(
        renewals(&server).is_empty(),
        "nothing was sent after the deadline"
    );
    drop(held);
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
}

/// A renewal whose answer hangs runs on the runtime's clock, which stands
/// still through a suspend: the loss must not wait for its timeout.
#[tokio::test]
async fn a_clock_jump_during_a_hanging_renewal_announces_the_loss_before_its_timeout() {
    let server = MockServer::start().await;
    server.inject(Fault::delay_response(Duration::from_secs(60)).on(Operation::Renew));
    let clock = LeaseClock::adjustable();
    let client = client_on(&server, &clock);
    let held = client
        .locks()
        .hold(KEY, Duration::from_secs(300))
        .await
        .unwrap();
    let mut watch = held.watch();
    // The renewal falls due; the server applies it and holds the answer.
    clock.advance(Duration::from_secs(70));
    assert!(eventually(Duration::from_secs(5), || renewals(&server).len() == 1).await);
    // The machine "sleeps" past the deadline while the answer hangs.
    clock.advance(Duration::from_secs(300));
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the loss is announced without waiting for the request's timeout")
        .unwrap();
    assert_eq!(held.failure().unwrap().reason(), LostReason::Expired);
    assert!(eventually(Duration::from_secs(5), || client.active_renewals() == 0).await);
    // The server applied that renewal: the dropped lock is still released.
    drop(held);
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    assert_eq!(held_on_server(&server), None);
}

/// A dropped lock whose background release is refused definitively (403,
/// say after the service key was rotated) is still held: `shutdown` says
/// so instead of reporting that all is well.
#[tokio::test]
async fn shutdown_reports_a_dropped_lock_whose_release_was_refused() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let token = uuid::Uuid::new_v4().to_string();
    let held = client.locks().hold(KEY, TTL).token(&token).await.unwrap();
    server.inject(Fault::status(403).on(Operation::Release));
    drop(held);
    assert_eq!(
        client.shutdown(Duration::from_secs(5)).await,
        vec![KEY.to_owned()]
    );
    assert!(
        held_on_server(&server).is_some(),
        "the lease is indeed live"
    );
    // Asked again, the answer is the same while that lease may be live.
    assert_eq!(client.shutdown(Duration::ZERO).await, vec![KEY.to_owned()]);
    // Recovered with its token, the lease is the caller's again: no longer
    // reported, and released by the caller.
    server.clear_faults();
    let lease = client
        .locks()
        .acquire(KEY, TTL)
        .token(&token)
        .await
        .unwrap();
    assert!(client.shutdown(Duration::ZERO).await.is_empty());
    client.locks().release(&lease).await.unwrap();
    assert!(held_on_server(&server).is_none());
}

/// A release handed to a runtime that is shutting down never runs: it is
/// reported (a warning, and by `shutdown`), not dropped silently.
#[test]
fn a_release_dropped_with_its_runtime_is_reported() {
    let host = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = host.block_on(MockServer::start());
    let client = mock_client(&server);
    let (captured, _default) = Captured::install(tracing::Level::WARN);
    let doomed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let held = doomed.block_on(client.locks().hold(KEY, TTL).into_future());
    let held = held.unwrap();
    // The lock lives in a task; the runtime's shutdown drops that task,
    // whose drop hands the release to the same, closing runtime.
    doomed.spawn(async move {
        let _held = held;
        std::future::pending::<()>().await
    });
    drop(doomed);
    let warned = captured.lines("dropped before it finished");
    assert_eq!(warned.len(), 1, "{:?}", captured.lines(""));
    let left = host.block_on(client.shutdown(Duration::from_secs(1)));
    assert_eq!(left, vec![KEY.to_owned()]);
    assert!(
        held_on_server(&server).is_some(),
        "left to its ttl, as reported"
    );
}

/// A lock dropped after its local deadline passed (no task ran to see it)
/// ended by expiry: the server may keep that lease a whole ttl, and the
/// guard's clones say `Expired`, not `Released`.
#[tokio::test]
async fn a_held_lock_dropped_after_its_deadline_reports_the_expiry() {
    let server = MockServer::start().await;
    let clock = LeaseClock::adjustable();
    let client = client_on(&server, &clock);
    let held = client.locks().hold(KEY, TTL).await.unwrap();
    let guard = volcano::LockGuard::clone(&held);
    // No await between the jump and the drop: the renewal task cannot run.
    clock.advance(TTL + Duration::from_secs(1));
    drop(held);
    assert_eq!(guard.failure().unwrap().reason(), LostReason::Expired);
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
}

/// At its max hold time a held lock stops renewing and is released by the
/// SDK, whatever its owner does, and reports `MaxHold`; the release goes
/// through even when its first answer is lost.
#[tokio::test]
async fn max_hold_ends_the_hold_and_releases_the_lease() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // Applied, answer dropped: the release is confirmed by trying again.
    server.inject(Fault::drop_response().on(Operation::Release).times(1));
    let started = std::time::Instant::now();
    let held = client
        .locks()
        .hold(KEY, TTL)
        .max_hold(Duration::from_secs(2))
        .await
        .unwrap();
    held.lost().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(held.failure().unwrap().reason(), LostReason::MaxHold);
    let released = server.wait_for(Operation::Release, 204, Duration::from_secs(5));
    assert!(released.await.is_some(), "{:?}", server.requests());
    assert_eq!(held_on_server(&server), None, "released before its ttl");
    let err = held.release().await.unwrap_err();
    match err {
        Error::LockLost(lost) => assert_eq!(lost.reason(), LostReason::MaxHold),
        other => panic!("{other:?}"),
    }
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    let err = client
        .locks()
        .hold(KEY, TTL)
        .max_hold(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

/// `with_lock(..).max_hold(d).cancel_on_loss()`: a stuck job is stopped at
/// the cap and the scope returns the loss.
#[tokio::test]
async fn max_hold_stops_a_stuck_scope() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let err = client
        .locks()
        .with_lock(KEY, TTL, |_guard| async {
            std::future::pending::<Result<(), Error>>().await
        })
        .max_hold(Duration::from_secs(1))
        .cancel_on_loss()
        .await
        .unwrap_err();
    match err {
        Error::LockLost(lost) => assert_eq!(lost.reason(), LostReason::MaxHold),
        other => panic!("{other:?}"),
    }
    assert_eq!(held_on_server(&server), None);
}

/// A leader's term lasts at most its max hold time: the term is dropped,
/// and the candidate leads again in a new term with a higher fence.
#[tokio::test]
async fn max_hold_bounds_each_leader_term() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(
        client
            .locks()
            .leader(KEY, TTL)
            .max_hold(Duration::from_secs(1))
            .poll_interval(Duration::from_millis(200))
            .until(async {
                let _ = stopped.await;
            })
            .run({
                let fences = fences.clone();
                move |term| {
                    fences.lock().unwrap().push(term.lease().fencing_token());
                    async { std::future::pending::<Result<(), Error>>().await }
                }
            }),
    );
    let two_terms = eventually(Duration::from_secs(8), || fences.lock().unwrap().len() >= 2);
    assert!(two_terms.await, "{:?}", fences.lock().unwrap());
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    let fences = fences.lock().unwrap().clone();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_eq!(held_on_server(&server), None);
}

/// The cap's release is registered before anyone can see the loss: an
/// acquire with the same (caller's) token right after `lost()` supersedes
/// it, and the lease it recovers is not freed behind its back.
#[tokio::test]
async fn a_lease_recovered_with_its_token_right_after_the_cap_stays_held() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // The cap's release is slow to arrive: a race would show.
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .on(Operation::Release)
            .times(1),
    );
    let token = uuid::Uuid::new_v4().to_string();
    let held = client
        .locks()
        .hold(KEY, TTL)
        .token(&token)
        .max_hold(Duration::from_secs(1))
        .await
        .unwrap();
    held.lost().await;
    let lease = client
        .locks()
        .acquire(KEY, TTL)
        .token(&token)
        .await
        .unwrap();
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    assert_eq!(
        held_on_server(&server),
        Some(lease.fencing_token()),
        "the recovered lease is live"
    );
    client.locks().release(&lease).await.unwrap();
    drop(held);
}

/// `hold` takes the acquire's options, `.timeout()` included: an acquire
/// applied but never answered fails within the timeout, not the client's,
/// and the lease it took is undone.
#[tokio::test]
async fn hold_timeout_bounds_the_acquire_and_an_unanswered_one_is_undone() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(
        Fault::delay_response(Duration::from_secs(20))
            .on(Operation::Acquire)
            .times(2),
    );
    let started = std::time::Instant::now();
    let err = client
        .locks()
        .hold(KEY, TTL)
        .timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Transport(t) if t.is_timeout()),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(client.shutdown(Duration::from_secs(10)).await.is_empty());
    assert_eq!(held_on_server(&server), None);
}
