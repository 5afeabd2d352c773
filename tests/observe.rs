//! A key's holders as a stream (DESIGN section 15): `locks.observe(key)`
//! yields each change, named on the service's clock; failed looks are
//! yielded and waited out; a bad input ends the stream.
//!
//! A look happens only while `next()` runs, so the changes made between
//! two calls are seen together by the next look: the tests rely on that,
//! not on timing.

mod common;

use std::time::Duration;

use common::mock_client;
use volcano::{ChangeKind, Error, LockChange, Observe};
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// How many looks (`get`) the server has seen.
fn looks(server: &MockServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Get)
        .count()
}

async fn next(changes: &mut Observe) -> LockChange {
    tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("a change within 10 s")
        .expect("the stream goes on")
        .expect("a good look")
}

#[tokio::test]
async fn every_kind_of_change_is_named() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let mut changes = locks.observe("report").poll_interval(POLL);
    assert_eq!(changes.key(), "report");

    let first = next(&mut changes).await;
    assert_eq!(
        (first.kind(), first.state().held()),
        (ChangeKind::Initial, false)
    );
    assert!(first.previous().is_none());

    let lease = locks.acquire("report", TTL).await.unwrap();
    let acquired = next(&mut changes).await;
    assert_eq!(acquired.kind(), ChangeKind::Acquired);
    assert_eq!(
        acquired.state().fencing_token(),
        Some(lease.fencing_token())
    );
    assert_eq!(acquired.previous().map(|s| s.held()), Some(false));
    let left = acquired.remaining().unwrap();
    assert!(
        left < TTL && left >= TTL - Duration::from_secs(2),
        "{left:?}"
    );

    let renewed = locks.renew(&lease, Duration::from_secs(60)).await.unwrap();
    let change = next(&mut changes).await;
    assert_eq!(change.kind(), ChangeKind::Renewed);
    assert_eq!(change.state().expires_at(), Some(renewed.expires_at()));

    // Released and acquired again between two looks: one change.
    locks.release(&renewed).await.unwrap();
    let again = locks.acquire("report", TTL).await.unwrap();
    let change = next(&mut changes).await;
    assert_eq!(change.kind(), ChangeKind::TakenOver);
    assert_eq!(
        change.previous().unwrap().fencing_token(),
        Some(lease.fencing_token())
    );
    assert_eq!(change.state().fencing_token(), Some(again.fencing_token()));

    locks.release(&again).await.unwrap();
    let change = next(&mut changes).await;
    assert_eq!(change.kind(), ChangeKind::Released);
    assert!(!change.state().held());
    assert_eq!(
        change.previous().unwrap().fencing_token(),
        Some(again.fencing_token())
    );

    // Force-released: the service does not say who freed it.
    let third = locks.acquire("report", TTL).await.unwrap();
    assert_eq!(next(&mut changes).await.kind(), ChangeKind::Acquired);
    locks.force_release("report").await.unwrap();
    assert_eq!(next(&mut changes).await.kind(), ChangeKind::Released);
    let _ = third;
}

/// The service's clock runs an hour ahead of this machine's (a skewed
/// host, or a mock clock moved): what is left, and released against
/// expired, follow the service's clock. On this machine's clock the lease
/// would have an hour and a half minute left, and its end read as a
/// release.
#[tokio::test]
async fn time_left_and_expiry_follow_the_services_clock() {
    let server = MockServer::start().await;
    server.advance(Duration::from_secs(3_600));
    let locks = mock_client(&server).locks();
    let mut changes = locks.observe("report").poll_interval(POLL);
    let lease = locks.acquire("report", TTL).await.unwrap();
    let held = next(&mut changes).await;
    assert_eq!(held.kind(), ChangeKind::Initial);
    let left = held.remaining().unwrap();
    assert!(left <= TTL, "{left:?} on the service's clock");
    let state = locks.get("report").await.unwrap();
    assert!(state.remaining().unwrap() <= TTL);
    assert!(state.read_at().is_some());

    // Into its last second, then past it and the grace.
    server.advance(TTL - Duration::from_millis(500));
    server.advance(Duration::from_secs(3));
    let change = next(&mut changes).await;
    assert_eq!(
        change.previous().unwrap().fencing_token(),
        Some(lease.fencing_token())
    );
    // Between the two moves no look came: which way it ended is unknown.
    assert_eq!(change.kind(), ChangeKind::Ended);

    // Now with a look in its last second.
    let second = locks.acquire("report", TTL).await.unwrap();
    assert_eq!(next(&mut changes).await.kind(), ChangeKind::Acquired);
    // The stream is read by a task of its own from here: no `next()` is
    // dropped in the middle of the look in the last second.
    let (sender, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Some(Ok(change)) = changes.next().await {
            if sender.send(change).is_err() {
                return;
            }
        }
    });
    server.advance(TTL - Duration::from_millis(500));
    // The look in the last second shows no change.
    let quiet = tokio::time::timeout(Duration::from_millis(400), seen.recv()).await;
    assert!(quiet.is_err(), "no change yet: {quiet:?}");
    server.advance(Duration::from_secs(3));
    let change = tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .expect("a change")
        .expect("the stream goes on");
    reader.abort();
    assert_eq!(change.kind(), ChangeKind::Expired);
    assert_eq!(
        change.previous().unwrap().fencing_token(),
        Some(second.fencing_token())
    );
}

/// A holder that stops renewing is seen gone about a second after its
/// lease, not a poll interval later: a look comes in its last moments.
#[tokio::test]
async fn an_expiry_is_seen_without_waiting_for_the_poll_interval() {
    let (server, mut changes, lease) = observed_5_s_lease().await;
    expires_in_a_few_seconds(&mut changes, &lease).await;
    let looks = looks(&server);
    assert!(looks <= 4, "{looks} looks for one expiry");
}

#[tokio::test]
async fn a_failed_look_is_yielded_and_a_429_waited_out() {
    let server = MockServer::builder().rate_limit(2).start().await;
    let locks = mock_client(&server).locks();
    let mut changes = locks.observe("report").poll_interval(POLL);
    assert_eq!(next(&mut changes).await.kind(), ChangeKind::Initial);
    let _ = locks.get("report").await.unwrap();
    let failed = changes.next().await.unwrap().unwrap_err();
    assert!(matches!(failed, Error::RateLimited(_)), "{failed:?}");
    assert!(changes.next_look_in() > Duration::from_millis(500));
    let asked = server.requests().len();
    let waited = tokio::time::timeout(Duration::from_millis(300), changes.next()).await;
    assert!(waited.is_err(), "waits out the window");
    assert_eq!(server.requests().len(), asked, "no request while it waits");
}

#[tokio::test]
async fn a_transient_failure_goes_on_and_changes_are_not_lost() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let mut changes = locks.observe("report").poll_interval(POLL);
    assert_eq!(next(&mut changes).await.kind(), ChangeKind::Initial);
    server.inject(Fault::status(503).on(Operation::Get).times(1));
    let failed = changes.next().await.unwrap().unwrap_err();
    assert!(failed.is_transient(), "{failed:?}");
    assert!(!changes.is_ended(), "a transient failure does not end it");
    let lease = locks.acquire("report", TTL).await.unwrap();
    let change = next(&mut changes).await;
    assert_eq!(change.kind(), ChangeKind::Acquired);
    assert_eq!(change.state().fencing_token(), Some(lease.fencing_token()));
}

#[tokio::test]
async fn bad_input_ends_the_stream_with_a_clear_error() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let mut bad_key = locks.observe("bad key");
    let err = bad_key.next().await.unwrap().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(bad_key.next().await.is_none());

    let mut too_fast = locks
        .observe("report")
        .poll_interval(Duration::from_millis(10));
    let err = too_fast.next().await.unwrap().unwrap_err();
    assert!(err.to_string().contains("poll_interval"), "{err}");
    assert!(too_fast.next().await.is_none());
    assert!(server.requests().is_empty(), "nothing sent for bad input");

    let rejected = volcano::Client::builder()
        .api_url(server.url())
        .allow_insecure_http(true)
        .service_key("not-the-key")
        .build()
        .unwrap();
    let mut changes = rejected.locks().observe("report");
    assert!(!changes.is_ended(), "not before a look");
    let err = changes.next().await.unwrap().unwrap_err();
    assert!(!err.is_transient(), "{err:?}");
    assert!(changes.is_ended(), "a refused look ends it");
    assert!(changes.next().await.is_none());
    assert!(bad_key.is_ended() && too_fast.is_ended());
}

/// A `next()` dropped while it waits (a `select!` that chose another
/// branch) loses nothing: the next call reports the change.
#[tokio::test]
async fn next_is_cancel_safe() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let mut changes = locks
        .observe("report")
        .poll_interval(Duration::from_millis(300));
    assert_eq!(next(&mut changes).await.kind(), ChangeKind::Initial);
    for _ in 0..5 {
        let _ = tokio::time::timeout(Duration::from_millis(50), changes.next()).await;
    }
    let lease = locks.acquire("report", TTL).await.unwrap();
    for _ in 0..3 {
        let _ = tokio::time::timeout(Duration::from_millis(1), changes.next()).await;
    }
    let change = next(&mut changes).await;
    assert_eq!(change.kind(), ChangeKind::Acquired);
    assert_eq!(change.state().fencing_token(), Some(lease.fencing_token()));
    assert!(format!("{changes:?}").contains("report"));
}

/// A 429 to one observer of a client holds back its others too: they wait
/// for the window instead of each spending a request to learn of it.
#[tokio::test]
async fn observers_of_one_client_share_a_429() {
    let server = MockServer::builder().rate_limit(3).start().await;
    let locks = mock_client(&server).locks();
    let mut one = locks.observe("a").poll_interval(POLL);
    let mut other = locks.observe("b").poll_interval(POLL);
    assert_eq!(next(&mut one).await.kind(), ChangeKind::Initial);
    assert_eq!(next(&mut other).await.kind(), ChangeKind::Initial);
    let _ = locks.get("c").await.unwrap();
    let failed = one.next().await.unwrap().unwrap_err();
    assert!(matches!(failed, Error::RateLimited(_)), "{failed:?}");
    let asked = server.requests().len();
    let waited = tokio::time::timeout(Duration::from_millis(300), other.next()).await;
    assert!(waited.is_err(), "the other waits out the window too");
    assert_eq!(server.requests().len(), asked, "no request from the other");
}

/// A caller that keeps dropping `next()` (a short timeout around it)
/// does not send a look each time: a look dropped in flight counts.
#[tokio::test]
async fn dropping_next_again_and_again_does_not_flood_the_service() {
    let server = MockServer::start().await;
    server.inject(Fault::delay_response(Duration::from_millis(300)).on(Operation::Get));
    let locks = mock_client(&server).locks();
    let mut changes = locks
        .observe("report")
        .poll_interval(Duration::from_secs(10));
    for _ in 0..20 {
        let _ = tokio::time::timeout(Duration::from_millis(20), changes.next()).await;
    }
    let looks = looks(&server);
    assert_eq!(looks, 1, "one look, then it waits its interval");
    assert!(changes.next_look_in() > Duration::from_secs(9));
}

/// A 429 that names its window (`Retry-After: 60`) holds the client's
/// other observers back until the window ends, each then by up to its own
/// poll interval: never before the end.
#[tokio::test]
async fn a_named_window_holds_the_other_observers_back_until_it_ends() {
    use wiremock::matchers::{method, path_regex};
    use wiremock::{Mock, ResponseTemplate};
    let server = common::server().await;
    let free = ResponseTemplate::new(200).set_body_json(serde_json::json!({"held": false}));
    let refused = common::error_body(429, "slow down", Some("rate_limited"))
        .insert_header("retry-after", "60");
    // The first look at `a` is answered, the next refused for a minute.
    Mock::given(method("GET"))
        .and(path_regex("/locks/a$"))
        .respond_with(free.clone())
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex("/locks/a$"))
        .respond_with(refused)
        .with_priority(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(free)
        .with_priority(3)
        .mount(&server)
        .await;
    let locks = common::client(&server.uri()).locks();
    let mut one = locks.observe("a").poll_interval(POLL);
    let mut others: Vec<Observe> = (0..5)
        .map(|i| {
            locks
                .observe(format!("k{i}"))
                .poll_interval(Duration::from_secs(10))
        })
        .collect();
    assert_eq!(next(&mut one).await.kind(), ChangeKind::Initial);
    for other in &mut others {
        assert_eq!(next(other).await.kind(), ChangeKind::Initial);
    }
    let failed = one.next().await.unwrap().unwrap_err();
    assert_eq!(failed.retry_after(), Some(Duration::from_secs(60)));
    for other in &mut others {
        // Its own next look was due in 10 s; now after the window.
        let waited = tokio::time::timeout(Duration::from_millis(20), other.next()).await;
        assert!(waited.is_err(), "no look during the window");
        let next_in = other.next_look_in();
        assert!(
            next_in >= Duration::from_secs(59) && next_in <= Duration::from_secs(70),
            "{next_in:?}"
        );
    }
}

/// A `next()` dropped while its look at a lease's last moments is in
/// flight (a `select!` branch that lost) changes nothing: the next call
/// gets that look's answer, sees the lease in its last moments, and
/// reports its expiry as `Expired`. (Once the dropped look counted as a
/// regular one: the next came a poll interval later, after the expiry, and
/// the stream said `Ended`.)
#[tokio::test]
async fn a_next_dropped_during_the_last_moments_look_changes_nothing() {
    let (server, mut changes, lease) = observed_5_s_lease().await;
    // The look at its last moments is held 300 ms on its way; the
    // `next()` waiting for it is dropped 100 ms after it was sent.
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .on(Operation::Get)
            .times(1),
    );
    let due = changes.next_look_in();
    let dropped = tokio::time::timeout(due + Duration::from_millis(100), changes.next()).await;
    assert!(dropped.is_err(), "dropped in flight: {dropped:?}");
    expires_in_a_few_seconds(&mut changes, &lease).await;
}

/// The same, but the caller comes back to `next()` only after the lease's
/// expiry (busy elsewhere for 2 s): the dropped look's answer, made in
/// the lease's last moments, is not lost; the stream still says `Expired`
/// (a look sent again after the expiry could only say `Ended`).
#[tokio::test]
async fn a_look_in_flight_when_next_is_dropped_is_answered_to_the_next_call() {
    let (server, mut changes, lease) = observed_5_s_lease().await;
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .on(Operation::Get)
            .times(1),
    );
    let due = changes.next_look_in();
    let dropped = tokio::time::timeout(due + Duration::from_millis(100), changes.next()).await;
    assert!(dropped.is_err(), "dropped in flight: {dropped:?}");
    let gets = |server: &MockServer| {
        server
            .requests()
            .iter()
            .filter(|r| r.operation == Operation::Get)
            .count()
    };
    let before = gets(&server);
    // Busy elsewhere until well past the expiry.
    tokio::time::sleep(Duration::from_secs(2)).await;
    expires_in_a_few_seconds(&mut changes, &lease).await;
    assert!(
        gets(&server) <= before + 2,
        "the dropped look is not sent again"
    );
}

/// A 5 s lease on "report", observed at a 60 s poll interval, its initial
/// state read.
async fn observed_5_s_lease() -> (MockServer, Observe, volcano::LockLease) {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let mut changes = locks
        .observe("report")
        .poll_interval(Duration::from_secs(60));
    let lease = locks
        .acquire("report", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(next(&mut changes).await.kind(), ChangeKind::Initial);
    (server, changes, lease)
}

/// The next change is `lease`'s expiry, seen within a few seconds of it
/// (not a 60 s poll interval later).
async fn expires_in_a_few_seconds(changes: &mut Observe, lease: &volcano::LockLease) {
    let change = tokio::time::timeout(Duration::from_secs(9), changes.next())
        .await
        .expect("seen within a few seconds of the expiry, not after 60 s")
        .unwrap()
        .unwrap();
    assert_eq!(change.kind(), ChangeKind::Expired);
    assert_eq!(
        change.previous().unwrap().fencing_token(),
        Some(lease.fencing_token())
    );
}
