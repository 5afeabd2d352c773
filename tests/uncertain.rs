//! Every uncertain outcome ends in a known state: answers that come late or
//! never, and futures dropped mid-request. Each fault here strikes *after*
//! the server applied the request. One test per case found in the field.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use volcano::{Client, Error, LeaseClock, LockGuard, LostReason};
use volcano_mock_server::{Fault, FaultKind, MockServer, Operation};
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

const TTL: Duration = Duration::from_secs(30);
const KEY: &str = "nightly-report";
const SHUTDOWN: Duration = Duration::from_secs(10);

fn acquires(server: &MockServer) -> usize {
    count(server, Operation::Acquire)
}

fn count(server: &MockServer, op: Operation) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == op)
        .count()
}

/// Whether the server still keeps a live lease on `key`.
fn held(server: &MockServer, key: &str) -> bool {
    server.locks().iter().any(|l| l.key == key && l.live)
}

/// The next acquire is applied at once and answered after `by`.
fn answer_late(server: &MockServer, by: Duration) {
    server.inject(Fault::delay_response(by).on(Operation::Acquire).times(1));
}

fn token() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[tokio::test]
async fn a_wait_sends_nothing_after_its_deadline_and_undoes_a_try_left_unanswered() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // Applied at once, answered after 4 s: past the 1 s wait and its grace.
    answer_late(&server, Duration::from_secs(4));
    let err = client
        .locks()
        .acquire(KEY, TTL)
        .wait(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    assert!(!err.is_lock_held(), "no false conflict: {err:?}");
    assert_eq!(acquires(&server), 1, "no retry was sent after the deadline");

    // The lease the server granted to a token the caller never saw is
    // released in the background; shutdown waits for that.
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY), "{:?}", server.locks());
}

#[tokio::test]
async fn a_late_answer_within_the_grace_is_returned_as_the_lease() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    answer_late(&server, Duration::from_millis(1_200));
    let lease = client
        .locks()
        .acquire(KEY, TTL)
        .wait(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(held(&server, KEY));
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(held(&server, KEY), "the lease the caller got is left alone");
    client.locks().release(&lease).await.unwrap();
}

#[tokio::test]
async fn a_wait_with_the_callers_token_reports_an_unanswered_try_not_the_older_conflict() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let holder = locks.acquire(KEY, TTL).await.unwrap();
    let mine = token();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        let mine = mine.clone();
        async move {
            locks
                .acquire(KEY, TTL)
                .token(mine)
                .wait(Duration::from_secs(2))
                .poll_interval(Duration::from_millis(200))
                .await
        }
    });
    let conflicts = || {
        server
            .requests()
            .iter()
            .any(|r| r.operation == Operation::Acquire && r.status == Some(409))
    };
    assert!(eventually(Duration::from_secs(5), conflicts).await);
    // The next try is applied, and its answer comes too late.
    answer_late(&server, Duration::from_secs(6));
    locks.release(&holder).await.unwrap();

    let err = waiter.await.unwrap().unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    assert!(
        !err.is_lock_held(),
        "the caller's token may hold it: {err:?}"
    );
    // Nothing undid it behind the caller's back; acquiring again with the
    // token recovers the very lease.
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(held(&server, KEY));
    let recovered = locks.acquire(KEY, TTL).token(mine).await.unwrap();
    assert!(recovered.fencing_token() > holder.fencing_token());
    locks.release(&recovered).await.unwrap();
}

#[tokio::test]
async fn with_lock_dropped_while_its_acquire_is_in_flight_releases_the_lease() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    answer_late(&server, Duration::from_millis(1_500));
    let ran = Arc::new(AtomicBool::new(false));
    let scope = client.locks().with_lock(KEY, TTL, {
        let ran = ran.clone();
        |_guard| async move {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, Error>(())
        }
    });
    let result = tokio::time::timeout(Duration::from_millis(300), scope).await;
    assert!(result.is_err(), "cancelled mid-acquire");
    assert!(held(&server, KEY), "the server applied the acquire");

    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY), "{:?}", server.locks());
    assert!(!ran.load(Ordering::SeqCst));
    // A fresh worker gets the lock at once instead of after the ttl.
    let lease = client.locks().acquire(KEY, TTL).await.unwrap();
    client.locks().release(&lease).await.unwrap();
}

#[tokio::test]
async fn try_with_lock_dropped_while_its_acquire_is_in_flight_releases_the_lease() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    answer_late(&server, Duration::from_secs(20));
    let ran = Arc::new(AtomicBool::new(false));
    let scope = tokio::spawn(
        client
            .locks()
            .try_with_lock(KEY, TTL, {
                let ran = ran.clone();
                |_guard| async move {
                    ran.store(true, Ordering::SeqCst);
                    Ok::<_, Error>(())
                }
            })
            .send(),
    );
    server
        .wait_for(Operation::Acquire, 201, Duration::from_secs(10))
        .await
        .expect("the server applied the acquire");
    scope.abort();
    assert!(scope.await.unwrap_err().is_cancelled());

    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY), "{:?}", server.locks());
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_hold_aborted_while_its_acquire_is_in_flight_releases_the_lease() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    answer_late(&server, Duration::from_secs(20));
    let hold = tokio::spawn(client.locks().hold(KEY, TTL).send());
    server
        .wait_for(Operation::Acquire, 201, Duration::from_secs(10))
        .await
        .expect("the server applied the acquire");
    assert!(held(&server, KEY));
    hold.abort();
    assert!(hold.await.unwrap_err().is_cancelled());

    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY), "{:?}", server.locks());
}

#[tokio::test]
async fn a_dropped_acquire_with_the_callers_token_is_left_for_the_caller_to_recover() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    answer_late(&server, Duration::from_millis(1_500));
    let mine = token();
    let acquire = client.locks().acquire(KEY, TTL).token(mine.clone());
    assert!(tokio::time::timeout(Duration::from_millis(300), acquire)
        .await
        .is_err());
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(held(&server, KEY), "not released behind the caller's back");
    let recovered = client.locks().acquire(KEY, TTL).token(mine).await.unwrap();
    client.locks().release(&recovered).await.unwrap();
    assert_eq!(count(&server, Operation::Release), 1);
}

#[tokio::test]
async fn with_lock_whose_acquire_ends_in_a_transport_error_releases_the_lease() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // Both tries are applied (the same token), neither is answered.
    server.inject(Fault::drop_response().on(Operation::Acquire).times(2));
    let err = client
        .locks()
        .with_lock(KEY, TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    assert!(held(&server, KEY), "the server applied the acquire");
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY), "{:?}", server.locks());
}

#[tokio::test]
async fn with_lock_whose_acquire_answers_an_unusable_201_releases_the_lease() {
    let server = server().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201).set_body_json(serde_json::json!({})))
        .expect(1)
        .mount(&server)
        .await;
    // Undone: a release at once, another once no try can land.
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .expect(2)
        .mount(&server)
        .await;
    let client = client(&server.uri());
    let err = client
        .locks()
        .with_lock(KEY, TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidResponse(_)), "{err:?}");
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    let requests = received(&server).await;
    assert_eq!(methods(&server).await, ["POST", "DELETE", "DELETE"]);
    assert_eq!(
        header(&requests[0], "x-volcano-lock-token"),
        header(&requests[1], "x-volcano-lock-token"),
        "released with the token the acquire sent"
    );
}

#[tokio::test]
async fn recovering_a_lease_near_its_90_day_cap_the_guard_keeps_the_servers_shorter_grant() {
    let server = MockServer::start().await;
    let clock = LeaseClock::adjustable();
    let client = Client::builder()
        .anon_key(server.anon_key())
        .service_key(server.service_key())
        .api_url(server.url())
        .timeout(Duration::from_secs(5))
        .lease_clock(clock.clone())
        .build()
        .unwrap();
    let locks = client.locks();
    let mine = token();
    let first = locks
        .acquire(KEY, volcano::MAX_TTL)
        .token(mine.clone())
        .await
        .unwrap();
    // 10 s before the acquisition's 90-day cap, the worker restarts and
    // recovers its lease with its token, asking for 30 s.
    server.advance(volcano::MAX_TTL - Duration::from_secs(10));
    let (tx, rx) = tokio::sync::oneshot::channel::<LockGuard>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let scope = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .with_lock(KEY, TTL, |guard| async move {
                    tx.send(guard).unwrap();
                    let _ = done_rx.await;
                    Ok::<_, Error>(())
                })
                .token(mine)
                .await
        }
    });
    let guard = rx.await.unwrap();
    assert_eq!(guard.lease().fencing_token(), first.fencing_token());
    assert!(
        guard.remaining() <= Duration::from_secs(10),
        "the server granted at most 10 s: {:?}",
        guard.remaining()
    );

    // 11 s later (on both clocks) the server has let go and another client
    // takes the lock: by then the guard must know.
    server.advance(Duration::from_secs(11));
    clock.advance(Duration::from_secs(11));
    let other = mock_client(&server);
    let theirs = other.locks().acquire(KEY, TTL).await.unwrap();
    assert!(theirs.fencing_token() > first.fencing_token());
    assert!(guard.is_lost(), "guard still believes it holds the lock");
    assert_eq!(guard.failure().unwrap().reason(), LostReason::Expired);

    done_tx.send(()).unwrap();
    let err = scope.await.unwrap().unwrap_err();
    assert!(err.is_ownership_lost(), "{err:?}");
}

#[tokio::test]
async fn a_release_retried_after_a_lost_answer_confirms_the_release_instead_of_reporting_a_loss() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // The first release is applied and its answer lost; the retry is held
    // on its way in long enough for a competitor to take the free lock.
    server.inject(Fault::drop_response().on(Operation::Release).times(1));
    server.inject(
        Fault::delay(Duration::from_millis(800))
            .on(Operation::Release)
            .times(2),
    );
    let competitor = mock_client(&server).locks();
    let job = tokio::spawn({
        let locks = client.locks();
        async move {
            locks
                .with_lock(KEY, TTL, |guard| async move {
                    Ok::<_, Error>(guard.lease().fencing_token())
                })
                .await
        }
    });
    let dropped = || {
        server
            .requests()
            .iter()
            .any(|r| r.operation == Operation::Release && r.fault == Some(FaultKind::DropResponse))
    };
    assert!(eventually(Duration::from_secs(5), dropped).await);
    let theirs = competitor.acquire(KEY, TTL).await.unwrap();

    let fence = job
        .await
        .unwrap()
        .expect("the job ran entirely under the lock");
    assert!(theirs.fencing_token() > fence);
    let retried = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Release)
        .map(|r| r.status)
        .collect::<Vec<_>>();
    assert_eq!(
        retried,
        [Some(204), Some(409)],
        "the retry met the competitor"
    );
    assert!(held(&server, KEY), "the competitor keeps its lock");
}

#[tokio::test]
async fn waiting_for_duration_max_means_waiting_forever_and_never_panics() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let lease = locks.acquire(KEY, TTL).wait(Duration::MAX).await.unwrap();
    // Held: a forever-wait keeps waiting until the caller gives up.
    let waiting = locks.acquire(KEY, TTL).wait(Duration::MAX);
    assert!(tokio::time::timeout(Duration::from_millis(300), waiting)
        .await
        .is_err());
    locks.release(&lease).await.unwrap();
    let value = locks
        .with_lock(KEY, TTL, |_guard| async { Ok::<_, Error>(7) })
        .wait(Duration::MAX)
        .await
        .unwrap();
    assert_eq!(value, 7);
    assert_eq!(client.shutdown(Duration::MAX).await, Vec::<String>::new());

    // A per-request timeout of Duration::MAX means no timeout.
    let patient = Client::builder()
        .service_key(server.service_key())
        .anon_key(server.anon_key())
        .api_url(server.url())
        .timeout(Duration::MAX)
        .build()
        .unwrap();
    let lease = patient.locks().acquire(KEY, TTL).await.unwrap();
    patient.locks().release(&lease).await.unwrap();
}

#[tokio::test]
async fn a_huge_retry_after_on_a_renewal_ends_in_a_loss_not_a_panic() {
    let server = server().await;
    Mock::given(method("POST"))
        .respond_with(lease_body(201, 7))
        .mount(&server)
        .await;
    Mock::given(method("PATCH"))
        .respond_with(
            error_body(429, "slow down", Some("lock_rate_limited"))
                .insert_header("retry-after", u64::MAX.to_string().as_str()),
        )
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let err = client(&server.uri())
        .locks()
        .with_lock(KEY, Duration::from_secs(5), |guard| async move {
            assert!(guard.wait_lost(Duration::from_secs(10)).await);
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    match err {
        Error::LockLost(lost) => {
            // Refused until no attempt fit: a renewal failure, with the
            // last answer as its cause.
            assert_eq!(lost.reason(), LostReason::RenewalFailed);
            assert_eq!(lost.cause().and_then(Error::status), Some(429));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn shutdown_waits_for_the_release_of_a_scope_cancelled_just_before_exit() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // A slow release: without waiting for it, the process would exit first.
    server.inject(
        Fault::delay(Duration::from_millis(500))
            .on(Operation::Release)
            .times(1),
    );
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn({
        let locks = client.locks();
        async move {
            locks
                .with_lock(KEY, TTL, |_guard| async move {
                    started_tx.send(()).unwrap();
                    std::future::pending::<Result<(), Error>>().await
                })
                .await
        }
    });
    started_rx.await.unwrap();
    worker.abort(); // SIGTERM: the supervisor cancels the worker
    assert!(worker.await.unwrap_err().is_cancelled());
    assert!(held(&server, KEY));

    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY), "released before shutdown returned");
    assert_eq!(client.active_renewals(), 0);
}

#[tokio::test]
async fn shutdown_names_the_keys_whose_release_did_not_finish_in_time() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(
        Fault::delay(Duration::from_secs(3))
            .on(Operation::Release)
            .times(1),
    );
    let scope = client.locks().with_lock(KEY, TTL, |_guard| {
        std::future::pending::<Result<(), Error>>()
    });
    assert!(tokio::time::timeout(Duration::from_millis(200), scope)
        .await
        .is_err());
    let unfinished = client.shutdown(Duration::from_millis(200)).await;
    assert_eq!(unfinished, [KEY]);
    // Still usable, and the release does finish.
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY));
}

#[tokio::test]
async fn an_acquire_whose_retry_is_refused_keeps_the_first_attempts_uncertainty() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // The first try is applied and unanswered; the retry meets the quota.
    server.inject(Fault::drop_response().on(Operation::Acquire).times(1));
    server.inject(Fault::status(429).on(Operation::Acquire).times(1));
    let err = client.locks().acquire(KEY, TTL).await.unwrap_err();
    assert!(err.is_transport(), "the outcome is unknown: {err:?}");
    assert_eq!(acquires(&server), 2);
    assert!(held(&server, KEY));
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert!(!held(&server, KEY), "undone: {:?}", server.locks());
}

/// Starts `with_lock(KEY).token(token)` and cancels it while the closure
/// runs, leaving its release to the background.
async fn cancel_a_scope(client: &Client, token: &str) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let scope = client
        .locks()
        .with_lock(KEY, TTL, |_guard| async move {
            started_tx.send(()).unwrap();
            std::future::pending::<Result<(), Error>>().await
        })
        .token(token);
    let task = tokio::spawn(async move { scope.await });
    started_rx.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
}

#[tokio::test]
async fn recovering_with_the_token_of_a_cancelled_scope_waits_for_its_release_in_flight() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(
        Fault::delay(Duration::from_millis(600))
            .on(Operation::Release)
            .times(1),
    );
    let mine = token();
    cancel_a_scope(&client, &mine).await;
    // The release is on its way; recovering now must not be undone by it.
    let recovered = client.locks().acquire(KEY, TTL).token(mine).await.unwrap();
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    assert_eq!(
        server
            .locks()
            .iter()
            .find(|l| l.key == KEY && l.live)
            .map(|l| l.fencing_token),
        Some(recovered.fencing_token()),
        "the recovered lease is live"
    );
}

#[tokio::test]
async fn recovering_with_the_token_of_a_cancelled_scope_stops_its_background_retries() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(Fault::status(503).on(Operation::Release));
    let mine = token();
    cancel_a_scope(&client, &mine).await;
    let refused = || {
        server
            .requests()
            .iter()
            .any(|r| r.operation == Operation::Release && r.status == Some(503))
    };
    assert!(eventually(Duration::from_secs(5), refused).await);
    let recovered = client.locks().acquire(KEY, TTL).token(mine).await.unwrap();
    assert_eq!(client.shutdown(SHUTDOWN).await, Vec::<String>::new());
    let releases = count(&server, Operation::Release);
    server.clear_faults();
    assert_eq!(count(&server, Operation::Release), releases);
    assert!(held(&server, KEY));
    client.locks().release(&recovered).await.unwrap();
}

#[tokio::test]
async fn guard_clones_stop_believing_before_the_final_release_is_sent() {
    struct Observe(Arc<std::sync::Mutex<Option<LockGuard>>>, Arc<AtomicBool>);
    impl wiremock::Respond for Observe {
        fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
            let guard = self.0.lock().unwrap();
            self.1.store(
                guard.as_ref().is_some_and(LockGuard::is_lost),
                Ordering::SeqCst,
            );
            ResponseTemplate::new(204)
        }
    }
    let server = server().await;
    Mock::given(method("POST"))
        .respond_with(lease_body(201, 7))
        .mount(&server)
        .await;
    let slot = Arc::new(std::sync::Mutex::new(None));
    let lost_when_released = Arc::new(AtomicBool::new(false));
    Mock::given(method("DELETE"))
        .respond_with(Observe(slot.clone(), lost_when_released.clone()))
        .expect(1)
        .mount(&server)
        .await;
    client(&server.uri())
        .locks()
        .with_lock(KEY, TTL, |guard| async move {
            *slot.lock().unwrap() = Some(guard);
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert!(lost_when_released.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_409_after_a_rate_limited_release_is_a_real_conflict() {
    let server = server().await;
    Mock::given(method("POST"))
        .respond_with(lease_body(201, 7))
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(error_body(429, "slow down", Some("lock_rate_limited")))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(error_body(
            409,
            "Lock ownership lost",
            Some("lock_ownership_lost"),
        ))
        .mount(&server)
        .await;
    // A 429 was not applied, so the 409 that follows says the lock was
    // already someone else's (a force release): not "released".
    let err = client(&server.uri())
        .locks()
        .with_lock(KEY, TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap_err();
    assert!(err.is_ownership_lost(), "{err:?}");
    assert_eq!(err.status(), Some(409));
}
