//! Waiting for a held lock: `acquire(..).wait(timeout)` and
//! `with_lock(..).wait(timeout)` against the mock server.

mod common;

use std::future::Future;
use std::time::Duration;

use common::{eventually, mock_client};
use tokio::time::Instant;
use volcano::Error;
use volcano_mock_server::{MockServer, Operation, RecordedRequest};

const TTL: Duration = Duration::from_secs(5);

fn count(server: &MockServer, op: Operation, status: Option<u16>) -> usize {
    server
        .requests()
        .iter()
        .filter(|r: &&RecordedRequest| {
            r.operation == op && (status.is_none() || r.status == status)
        })
        .count()
}

#[tokio::test]
async fn a_waiter_acquires_right_after_the_holder_releases() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let holder = locks.acquire("job", TTL).await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let lease = locks
                .acquire("job", TTL)
                .wait(Duration::from_secs(20))
                .poll_interval(Duration::from_millis(500))
                .await;
            (lease, Instant::now())
        })
    };
    // Let the waiter settle into its poll interval first.
    assert!(
        eventually(Duration::from_secs(10), || count(
            &server,
            Operation::Acquire,
            Some(409)
        ) >= 4)
        .await
    );
    locks.release(&holder).await.unwrap();
    let released = Instant::now();
    let (lease, acquired) = waiter.await.unwrap();
    let lease = lease.expect("the waiter gets the lock");
    let delay = acquired - released;
    eprintln!("release-to-acquire delay: {delay:?}");
    assert!(lease.fencing_token() > holder.fencing_token());
    // Within about one poll interval (500 ms ±20 %) and a few round trips.
    assert!(
        delay < Duration::from_millis(1_500),
        "picked up after {delay:?}"
    );
}

#[tokio::test]
async fn a_waiter_acquires_after_the_holders_lease_expires() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let crashed = locks.acquire("job", TTL).await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .acquire("job", TTL)
                .wait(Duration::from_secs(20))
                .await
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || count(
            &server,
            Operation::Get,
            None
        ) >= 1)
        .await
    );
    server.advance(TTL + Duration::from_secs(1));
    let lease = waiter.await.unwrap().expect("acquired after expiry");
    assert!(lease.fencing_token() > crashed.fencing_token());
}

#[tokio::test]
async fn a_waiter_times_out_with_the_last_conflict() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let _holder = locks.acquire("job", Duration::from_secs(60)).await.unwrap();
    let started = Instant::now();
    let err = locks
        .acquire("job", TTL)
        .wait(Duration::from_millis(1_500))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(err.is_lock_held(), "{err:?}");
    assert!(took >= Duration::from_millis(1_500), "{took:?}");
    assert!(
        took < Duration::from_millis(2_500),
        "never much past the timeout: {took:?}"
    );
    // The same token on every try.
    let request_ids: std::collections::HashSet<_> = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Acquire && r.status == Some(409))
        .map(|r| r.request_id.clone())
        .collect();
    assert_eq!(request_ids.len(), 1, "one logical call, one request id");
}

#[tokio::test]
async fn a_cancelled_waiter_sends_nothing_more() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let _holder = locks.acquire("job", Duration::from_secs(60)).await.unwrap();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .acquire("job", TTL)
                .wait(Duration::from_secs(60))
                .poll_interval(Duration::from_millis(200))
                .await
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || count(
            &server,
            Operation::Acquire,
            Some(409)
        ) >= 3)
        .await
    );
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    let before = server.requests().len();
    // Watch for 1 s, longer than three poll intervals (240 ms at most): a
    // waiter still polling would send at least two more. One request
    // already on the wire when the task was aborted may still land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = server.requests().len();
    assert!(after <= before + 1, "{before} requests, then {after}");
}

#[tokio::test]
async fn a_waiter_stays_within_its_request_budget() {
    let window = std::env::var("VOLCANO_WAIT_WINDOW_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(6), Duration::from_secs);
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    // The holder renews in the background for the whole window.
    let holding = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_lock("job", TTL, |_guard| async move {
                    tokio::time::sleep(window + Duration::from_secs(2)).await;
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || count(
            &server,
            Operation::Acquire,
            Some(201)
        ) == 1)
        .await
    );
    let err = locks.acquire("job", TTL).wait(window).await.unwrap_err();
    assert!(err.is_lock_held());
    let tries = count(&server, Operation::Acquire, Some(409));
    let gets = count(&server, Operation::Get, None);
    let per_minute = (tries + gets) as f64 * 60.0 / window.as_secs_f64();
    eprintln!(
        "waiter over {window:?}: {tries} acquires + {gets} gets = {per_minute:.0} requests/minute"
    );
    // Documented budget: the tries follow the ramp, 0.3 s apart for the
    // first second (at least 0.27 s with the jitter), then 30 % of the
    // time waited (at least 27 %), up to the poll interval (10 s, at least
    // 9 s); the waiter looks (get) once at first and then at most at each
    // takeover moment (expires_at + 1 s: at least about 4 s apart with a
    // 5 s ttl renewed every 1.7 s). Over a minute that is about 20 tries,
    // over 10 minutes about 8 a minute.
    let secs = window.as_secs_f64();
    let ramp_tries = |secs: f64| -> f64 {
        let floor = secs.min(1.0) / 0.27;
        let ratio = secs.clamp(1.0, 37.0).ln() / 0.27;
        let steady = (secs - 37.0).max(0.0) / 9.0;
        1.0 + floor + ratio + steady
    };
    assert!(
        tries as f64 <= ramp_tries(secs) + 1.0,
        "{tries} tries in {window:?}, budget {:.1}",
        ramp_tries(secs)
    );
    assert!(gets as f64 <= 1.0 + secs / 4.0, "{gets} gets in {window:?}");
    assert!(
        per_minute <= 60.0 * (ramp_tries(secs) + 2.0 + secs / 4.0) / secs,
        "{per_minute:.0} requests a minute"
    );
    holding.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_waiter_honours_the_quota_without_overshooting_its_timeout() {
    let started_minute = chrono::Utc::now().timestamp() / 60;
    let server = MockServer::builder().rate_limit(4).start().await;
    let locks = mock_client(&server).locks();
    let _holder = locks.acquire("job", Duration::from_secs(60)).await.unwrap();
    let started = Instant::now();
    // Holder, try, look, one poll: the next one gets a 429 naming the rest
    // of the minute, and the waiter sleeps to its own deadline.
    let err = locks
        .acquire("job", TTL)
        .wait(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        err.is_lock_held(),
        "the last conflict, not the 429: {err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The mock's quota window is the wall-clock minute: a run that
    // crossed into the next one may not have hit it.
    let crossed = started_minute != chrono::Utc::now().timestamp() / 60;
    assert!(
        crossed || count(&server, Operation::Acquire, Some(429)) >= 1,
        "the quota was hit"
    );
}

#[tokio::test]
async fn other_errors_end_the_wait_at_once() {
    let server = MockServer::start().await;
    let err = volcano::Client::builder()
        .anon_key(server.anon_key())
        .service_key("wrong")
        .api_url(server.url())
        .build()
        .unwrap()
        .locks()
        .acquire("job", TTL)
        .wait(Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(401));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn with_lock_can_wait_and_its_guard_starts_fresh() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let holder = locks.acquire("job", TTL).await.unwrap();
    let waiting = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_lock("job", TTL, |guard| async move {
                    assert!(!guard.is_lost());
                    assert!(
                        guard.remaining() > Duration::from_secs(4),
                        "{:?}",
                        guard.remaining()
                    );
                    Ok::<_, Error>(guard.lease().fencing_token())
                })
                .wait(Duration::from_secs(20))
                .poll_interval(Duration::from_millis(200))
                .await
        })
    };
    // Hold the lock for longer than the waiter's ttl: its deadline must be
    // measured from the try that succeeded, not from when it began waiting.
    assert!(
        eventually(Duration::from_secs(10), || count(
            &server,
            Operation::Acquire,
            Some(409)
        ) >= 9)
        .await
    );
    locks.release(&holder).await.unwrap();
    let fence = waiting.await.unwrap().unwrap();
    assert!(fence > holder.fencing_token());
}

/// A waiter's last try answered 500 may have been applied, so it is
/// undone; the lock is another token's, and the release's 409 says
/// nothing of ours is held: no warning about a failed release, nothing
/// reported by `shutdown`.
#[tokio::test]
async fn undoing_a_try_on_a_lock_held_elsewhere_is_not_a_failed_release() {
    use volcano_mock_server::Fault;
    let (captured, _default) = common::Captured::install(tracing::Level::DEBUG);
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let _holder = client.locks().acquire("report", TTL).await.unwrap();
    // The waiter's only try (a zero wait) gets a 500.
    server.inject(Fault::status(500).on(Operation::Acquire).times(1));
    let err = client
        .locks()
        .acquire("report", TTL)
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(500), "{err:?}");
    assert!(client.shutdown(Duration::from_secs(10)).await.is_empty());
    let undone = server
        .requests()
        .into_iter()
        .any(|r| r.operation == Operation::Release && r.status == Some(409));
    assert!(undone, "the try was undone: {:?}", server.requests());
    assert!(
        captured.lines("background release failed").is_empty(),
        "{:?}",
        captured.lines("release")
    );
}

/// A 503 that says when to come back (`Retry-After`) is honoured by a
/// waiting acquire as a 429 is: no try before then.
#[tokio::test]
async fn a_waiter_honours_retry_after_on_a_503() {
    use wiremock::matchers::method;
    use wiremock::{Mock, ResponseTemplate};
    let wire = common::server().await;
    common::unavailable_then(&wire, "POST", 2, 2, common::lease_body(201, 1)).await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&wire)
        .await;
    let client = common::client(&wire.uri());
    let started = Instant::now();
    let lease = client
        .locks()
        .acquire("report", TTL)
        .wait(Duration::from_secs(10))
        // Retry-After plus up to one poll interval of spread.
        .poll_interval(Duration::from_millis(500))
        .await
        .unwrap();
    // The try (sent twice: acquire's own retry on a 503) then the wait.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "tried again after {:?}",
        started.elapsed()
    );
    assert_eq!(common::received(&wire).await.len(), 3);
    client.locks().release(&lease).await.unwrap();
}

/// The holder's time left is read on the server's clock (`expires_at`
/// minus the answer's `Date`), not this machine's: a server clock an hour
/// behind ours does not make the waiter look every second.
#[tokio::test]
async fn a_waiter_reads_the_holders_time_left_on_the_servers_clock() {
    use wiremock::matchers::method;
    use wiremock::{Mock, ResponseTemplate};
    let wire = common::server().await;
    let server_now = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    Mock::given(method("POST"))
        .respond_with(common::error_body(409, "Lock is held", Some("lock_held")))
        .mount(&wire)
        .await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header(
                    "date",
                    server_now
                        .format("%a, %d %b %Y %H:%M:%S GMT")
                        .to_string()
                        .as_str(),
                )
                .set_body_json(serde_json::json!({
                    "held": true,
                    "expires_at": (server_now + chrono::TimeDelta::seconds(30)).to_rfc3339(),
                    "fencing_token": 4,
                })),
        )
        .mount(&wire)
        .await;
    let err = common::client(&wire.uri())
        .locks()
        .acquire("report", TTL)
        .wait(Duration::from_secs(3))
        .await
        .unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    let gets = common::received(&wire)
        .await
        .iter()
        .filter(|r| r.method.as_str() == "GET")
        .count();
    assert_eq!(gets, 1, "30 s left by the server's clock: one look");
}

/// One trial: a holder in another client releases gracefully `into` after
/// the waiter began; how long after the release the waiter held the lock.
async fn pickup(into: Duration) -> Duration {
    let server = MockServer::builder().rate_limit(600).start().await;
    let holder = mock_client(&server)
        .locks()
        .acquire("job", Duration::from_secs(60))
        .await
        .unwrap();
    let waiter = mock_client(&server).locks();
    let waiting = tokio::spawn(async move {
        let lease = waiter
            .acquire("job", TTL)
            .wait(Duration::from_secs(30))
            .await;
        (lease, Instant::now())
    });
    tokio::time::sleep(into).await;
    let holders = mock_client(&server).locks();
    holders.release(&holder).await.unwrap();
    let released = Instant::now();
    let (lease, held_at) = waiting.await.unwrap();
    lease.unwrap();
    held_at.saturating_duration_since(released)
}

/// Fast when it matters: a wait that began 1 s before a graceful release
/// (defaults: the waiter knows nothing but that the key is held) holds the
/// lock within 1 s of the release, in every one of 12 trials run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_begun_a_second_before_a_graceful_release_holds_within_a_second() {
    let trials: Vec<_> = (0..12)
        .map(|_| tokio::spawn(pickup(Duration::from_secs(1))))
        .collect();
    let mut delays = Vec::new();
    for trial in trials {
        delays.push(trial.await.unwrap());
    }
    assert!(
        delays.iter().all(|d| *d <= Duration::from_secs(1)),
        "release -> held: {delays:?}"
    );
}

/// Waiters of one client on one key take turns: twenty cost the project
/// what one does (only the first in line sends), and when the key frees
/// they get it in the order they began waiting.
#[tokio::test]
async fn twenty_waiters_of_one_client_cost_what_one_does_and_go_in_order() {
    let server = MockServer::start().await;
    let holder = mock_client(&server)
        .locks()
        .acquire("job", Duration::from_secs(60))
        .await
        .unwrap();
    let waiters = mock_client(&server).locks();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (locks, order) = (waiters.clone(), order.clone());
        let mut waiting = Box::pin(async move {
            let lease = locks
                .acquire("job", TTL)
                .wait(Duration::from_secs(30))
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            // Done at once: the next in line takes over.
            locks.release(&lease).await.unwrap();
        });
        // Polled once here, in this order: a waiter takes its place in the
        // line before it sends anything.
        std::future::poll_fn(|cx| {
            let _ = waiting.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        tasks.push(tokio::spawn(waiting));
    }
    // Waited a while: the first in line has tried and looked; the others
    // sent their first try only.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let gets = count(&server, Operation::Get, None);
    let tries = count(&server, Operation::Acquire, Some(409));
    let one = {
        let alone = MockServer::start().await;
        let holder = mock_client(&alone)
            .locks()
            .acquire("job", Duration::from_secs(60))
            .await
            .unwrap();
        let _ = mock_client(&alone)
            .locks()
            .acquire("job", TTL)
            .wait(Duration::from_millis(3_200))
            .await;
        drop(holder);
        (
            count(&alone, Operation::Get, None),
            count(&alone, Operation::Acquire, Some(409)),
        )
    };
    assert!(
        gets <= one.0,
        "looks: 20 waiters {gets}, one waiter {}",
        one.0
    );
    assert!(
        tries <= one.1 + 2,
        "tries: 20 waiters {tries}, one waiter {}",
        one.1
    );
    mock_client(&server).locks().release(&holder).await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("every waiter gets its turn")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
}

/// A waiting acquire waits through a gateway's 502 and a 500 as it does
/// through a 503: it asked to wait, and the same token makes another try
/// safe. The holder's release is then noticed.
#[tokio::test]
async fn a_waiter_waits_through_500_and_502() {
    use volcano_mock_server::Fault;
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let holder = client.locks().acquire("report", TTL).await.unwrap();
    server.inject(Fault::status(502).on(Operation::Acquire).times(1));
    server.inject(Fault::status(500).on(Operation::Acquire).times(1));
    let waiting = tokio::spawn({
        let locks = client.locks();
        async move {
            locks
                .acquire("report", TTL)
                .wait(Duration::from_secs(10))
                .poll_interval(Duration::from_millis(200))
                .await
        }
    });
    // Both faults answered before the holder lets go.
    let faulted = || {
        server
            .requests()
            .iter()
            .filter(|r| r.operation == Operation::Acquire && matches!(r.status, Some(500 | 502)))
            .count()
    };
    assert!(eventually(Duration::from_secs(5), || faulted() >= 2).await);
    client.locks().release(&holder).await.unwrap();
    let lease = waiting.await.unwrap().expect("waited through the 5xx");
    assert!(lease.fencing_token() > holder.fencing_token());
}

/// One quota clock per client: a 429 to one waiter's try (`Retry-After:
/// 1`) holds back the client's other waiter, on another key, until that
/// window has passed (after its first try, which goes at once). Without
/// the shared clock the other waiter, early on its ramp, looks at once and
/// tries every 0.3 s.
#[tokio::test]
async fn a_429_to_one_waiter_holds_back_the_clients_other_waiters() {
    let server = MockServer::start().await;
    let holder = mock_client(&server);
    let _a = holder.locks().hold("a", TTL).await.unwrap();
    let _b = holder.locks().hold("b", TTL).await.unwrap();
    let client = mock_client(&server);
    server.inject(
        volcano_mock_server::Fault::status(429)
            .on(Operation::Acquire)
            .key("a")
            .times(1),
    );
    let waits = |key: &'static str| {
        let locks = client.locks();
        async move {
            locks
                .acquire(key, TTL)
                .wait(Duration::from_millis(2_500))
                .await
        }
    };
    // The other waiter begins once the 429 has come back.
    let (a, b) = tokio::join!(waits("a"), async {
        assert!(
            eventually(Duration::from_secs(5), || {
                server.requests().iter().any(|r| r.status == Some(429))
            })
            .await
        );
        waits("b").await
    });
    assert!(a.is_err() && b.is_err());
    let journal = server.requests();
    let refused = journal
        .iter()
        .find(|r| r.status == Some(429))
        .expect("the 429")
        .at;
    let window = refused + chrono::TimeDelta::milliseconds(1_000);
    // Its first try goes at once (a wait's first try is not held back);
    // after its answer, nothing until the window has passed.
    let tried_meanwhile: Vec<&RecordedRequest> = journal
        .iter()
        .filter(|r| r.key == "b" && r.at > refused && r.at < window)
        .skip(1)
        .collect();
    assert!(
        tried_meanwhile.is_empty(),
        "the other waiter tried within the window: {tried_meanwhile:?}"
    );
}
