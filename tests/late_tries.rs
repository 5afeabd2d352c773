//! A try that lands after the undo meant to cancel it. An acquire's
//! outcome is a window, not an event: a request held on its way, or one a
//! gateway answered 503/504 for while it went on to the service, can be
//! applied after the SDK has released the token it carries. The SDK owns
//! the key until no try can land (the try's timeout plus a margin after
//! its outcome became unknown): no lease of a generated token outlives
//! that window, and `Client::shutdown` names the key until then.
//!
//! Each test puts a small gateway (tests/common/gateway.rs) between the
//! client and the mock server, so that the fault strikes *after* the
//! client gave up on the try, and waits in real time: the window is the
//! protocol's own seconds (5 s of request timeout and 2 s of margin).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::gateway::{Gateway, Plan, Seen};
use volcano::Client;
use volcano_mock_server::{MockServer, Operation};

const KEY: &str = "nightly-report";
const TTL: Duration = Duration::from_secs(30);
/// Longer than the window (5 s request timeout + 2 s margin) after the
/// fault, with room for the second release's answer.
const SHUTDOWN: Duration = Duration::from_secs(15);

/// Whether the server keeps a live lease on `key` now.
fn held(server: &MockServer) -> bool {
    server.locks().iter().any(|l| l.key == KEY && l.live)
}

fn client_through(gateway: &Gateway, server: &MockServer) -> Client {
    Client::builder()
        .anon_key(server.anon_key())
        .service_key(server.service_key())
        .api_url(&gateway.url)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

fn is_acquire(seen: &Seen) -> bool {
    seen.method == "POST" && seen.path.ends_with("/lease")
}

/// The first acquire that reaches the gateway gets `first`, every other
/// request passes.
fn first_acquire(first: Plan) -> impl Fn(&Seen) -> Plan + Send + Sync + 'static {
    let acquires = Arc::new(AtomicUsize::new(0));
    move |seen| {
        if is_acquire(seen) && acquires.fetch_add(1, Ordering::SeqCst) == 0 {
            first
        } else {
            Plan::Pass
        }
    }
}

/// Waits (in real time, up to 5 s) until the server has applied an
/// acquire granted 201 after `releases_before` releases were applied.
async fn late_grant_lands(server: &MockServer) {
    let landed = common::eventually(Duration::from_secs(5), || {
        let journal = server.requests();
        let first_release = journal
            .iter()
            .position(|r| r.operation == Operation::Release);
        first_release.is_some_and(|at| {
            journal[at..]
                .iter()
                .any(|r| r.operation == Operation::Acquire && r.status == Some(201))
        })
    })
    .await;
    assert!(
        landed,
        "the late try never landed: {:#?}",
        server.requests()
    );
}

/// Once the late try has landed the key is held and `shutdown` names it;
/// once the window has closed the undo has freed it and `shutdown` says
/// all is well.
async fn owned_until_the_window_closes(client: &Client, server: &MockServer) {
    late_grant_lands(server).await;
    assert!(held(server), "{:?}", server.locks());
    assert_eq!(
        client.shutdown(Duration::from_millis(50)).await,
        vec![KEY.to_owned()],
        "while a try may still land, shutdown names the key"
    );
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(
        !held(server),
        "a try that landed after the undo's first release keeps the key: {:?}",
        server.locks()
    );
}

#[tokio::test]
async fn a_dropped_acquire_whose_try_lands_after_the_undo_is_released_again() {
    let server = MockServer::start().await;
    let gateway = Gateway::start(
        server.url(),
        first_acquire(Plan::Hold(Duration::from_millis(600))),
    )
    .await;
    let client = client_through(&gateway, &server);
    // Dropped 150 ms in, while its try is held on its way.
    let acquire = async { client.locks().acquire(KEY, TTL).await };
    assert!(tokio::time::timeout(Duration::from_millis(150), acquire)
        .await
        .is_err());
    owned_until_the_window_closes(&client, &server).await;
}

/// A gateway answers 504 (its HTML page, or JSON of its own) and lets
/// the acquire go on: it lands 1.5 s later, after the undo's first release.
async fn a_gateway_504_applied_later_is_undone(json: bool) {
    let server = MockServer::start().await;
    let gateway = Gateway::start(
        server.url(),
        first_acquire(Plan::GiveUp {
            status: 504,
            patience: Duration::from_millis(400),
            apply_after: Duration::from_millis(1_500),
            json,
        }),
    )
    .await;
    let client = client_through(&gateway, &server);
    let err = client.locks().acquire(KEY, TTL).await.unwrap_err();
    assert_eq!(err.status(), Some(504), "{err:?}");
    assert!(err.may_have_been_applied(), "{err:?}");
    assert!(!held(&server), "not applied yet: the gateway holds it");
    owned_until_the_window_closes(&client, &server).await;
}

#[tokio::test]
async fn a_gateway_504_whose_request_is_applied_later_is_undone() {
    a_gateway_504_applied_later_is_undone(false).await;
}

/// Gateways send JSON too: `{"code":504,"message":..}` is not the
/// service's envelope, so it says nothing of whether the try was handled.
#[tokio::test]
async fn a_gateway_504_in_json_keeps_the_late_window() {
    a_gateway_504_applied_later_is_undone(true).await;
}

/// Another client holds the key; the first attempt is answered 503 by the
/// gateway and applied 1.5 s later; the retry (sent at once) is answered
/// 409; the other lease is released before the first attempt lands.
async fn held_elsewhere_then_released(server: &MockServer) -> Gateway {
    let gateway = Gateway::start(
        server.url(),
        first_acquire(Plan::GiveUp {
            status: 503,
            patience: Duration::from_millis(100),
            apply_after: Duration::from_millis(1_500),
            json: false,
        }),
    )
    .await;
    let other = common::mock_client(server);
    let lease = other.locks().acquire(KEY, TTL).await.expect("other holds");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        other.locks().release(&lease).await.expect("other releases");
    });
    gateway
}

#[tokio::test]
async fn a_retry_answered_409_keeps_the_first_attempts_uncertainty_and_is_undone() {
    let server = MockServer::start().await;
    let gateway = held_elsewhere_then_released(&server).await;
    let client = client_through(&gateway, &server);
    let err = client.locks().acquire(KEY, TTL).await.unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    assert!(
        err.may_have_been_applied(),
        "the 409 answered the retry; the first attempt may still land: {err:?}"
    );
    assert_eq!(gateway.seen().iter().filter(|s| is_acquire(s)).count(), 2);
    owned_until_the_window_closes(&client, &server).await;
}

#[tokio::test]
async fn try_with_lock_skips_on_such_a_409_and_still_leaves_nothing_held() {
    let server = MockServer::start().await;
    let gateway = held_elsewhere_then_released(&server).await;
    let client = client_through(&gateway, &server);
    let ran = client
        .locks()
        .try_with_lock(KEY, TTL, |_guard| async { Ok::<_, volcano::Error>(()) })
        .await
        .expect("a lock held elsewhere is a skip");
    assert!(ran.is_none());
    owned_until_the_window_closes(&client, &server).await;
}

#[tokio::test]
async fn a_wait_whose_uncertain_try_is_followed_by_409s_is_undone() {
    let server = MockServer::start().await;
    let gateway = held_elsewhere_then_released(&server).await;
    let client = client_through(&gateway, &server);
    // Gives up before the other lease is released: every later try is
    // answered 409, and the first may still land.
    let err = client
        .locks()
        .acquire(KEY, TTL)
        .wait(Duration::from_millis(400))
        .await
        .unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    assert!(err.may_have_been_applied(), "{err:?}");
    owned_until_the_window_closes(&client, &server).await;
}

#[tokio::test]
async fn a_callers_token_is_told_and_never_released_behind_its_back() {
    let server = MockServer::start().await;
    let gateway = held_elsewhere_then_released(&server).await;
    let client = client_through(&gateway, &server);
    let token = uuid::Uuid::new_v4().to_string();
    // try_with_lock does not read this 409 as a skip: the caller must
    // know, to recover the lease with its token.
    let err = client
        .locks()
        .try_with_lock(KEY, TTL, |_guard| async { Ok::<_, volcano::Error>(()) })
        .token(token.clone())
        .await
        .unwrap_err();
    assert!(err.is_lock_held() && err.may_have_been_applied(), "{err:?}");
    late_grant_lands(&server).await;
    // Nothing is undone behind the caller's back: the caller recovers the
    // lease with its token.
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(held(&server));
    let lease = client
        .locks()
        .acquire(KEY, TTL)
        .token(token)
        .await
        .expect("recovered");
    client.locks().release(&lease).await.expect("released");
}

/// A renewal on its way when the job ends (held 5 s by the gateway) lands
/// after the renewal that kept the minimum, and would set the expiry a
/// whole ttl from then. The key is free by the minimum's end plus the
/// grace, late renewal or not: the SDK renews back to the minimum's end
/// once the renewal can no longer land (a long minimum), or releases at
/// the minimum's end, so that one landing later finds no lease (a short
/// one).
async fn a_late_renewal_does_not_stretch_a_minimum_of(minimum: Duration, then: Duration) {
    let server = MockServer::start().await;
    let patches = Arc::new(AtomicUsize::new(0));
    let gateway = Gateway::start(server.url(), {
        let patches = patches.clone();
        move |seen: &Seen| {
            if seen.method == "PATCH" && patches.fetch_add(1, Ordering::SeqCst) == 0 {
                Plan::Hold(Duration::from_secs(5))
            } else {
                Plan::Pass
            }
        }
    })
    .await;
    let client = client_through(&gateway, &server);
    let began = server.now();
    let held = client
        .locks()
        .hold(KEY, Duration::from_secs(15))
        .min_hold(minimum)
        .await
        .unwrap();
    // The job ends while its first renewal is on its way.
    let on_its_way = common::eventually(Duration::from_secs(12), || {
        gateway.seen().iter().any(|s| s.method == "PATCH")
    })
    .await;
    assert!(on_its_way, "no renewal was sent");
    // The gateway forwards it 5 s after it arrived.
    let lands = tokio::time::Instant::now() + Duration::from_millis(5_300);
    held.release().await.unwrap();
    // The late one applied; then `then`.
    tokio::time::sleep_until(lands).await;
    tokio::time::sleep(then).await;
    let kept_until = began + chrono::Duration::from_std(minimum).unwrap();
    if let Some(lease) = server.locks().into_iter().find(|l| l.key == KEY && l.live) {
        assert!(
            lease.expires_at <= kept_until + chrono::Duration::seconds(2),
            "the late renewal stretched the kept minimum to {} (minimum's end {kept_until}): \
             {:#?}",
            lease.expires_at,
            server.requests()
        );
    }
    // Never released before the minimum's end.
    let released = server
        .requests()
        .into_iter()
        .find(|r| r.operation == Operation::Release && r.status == Some(204));
    if let Some(released) = released {
        assert!(
            released.at >= kept_until,
            "released before the minimum's end: {released:?}"
        );
    }
}

#[tokio::test]
async fn a_renewal_landing_after_a_kept_minimum_does_not_stretch_it() {
    // Checked once the late one's window has closed (sent + 5 s + 2 s).
    a_late_renewal_does_not_stretch_a_minimum_of(Duration::from_secs(20), Duration::from_secs(3))
        .await;
}

#[tokio::test]
async fn a_renewal_landing_after_a_short_minimum_finds_the_key_released() {
    // The late one lands at 10 s, before the keep's expiry (11 s), and
    // would stretch it to 25 s. Checked past the minimum's end (11 s) and
    // before the late one's window has closed (12 s): released at the
    // minimum's end.
    a_late_renewal_does_not_stretch_a_minimum_of(
        Duration::from_secs(11),
        Duration::from_millis(1_200),
    )
    .await;
}
