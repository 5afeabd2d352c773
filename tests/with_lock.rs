//! with_lock's exact call sequences and outcome precedence, against
//! wiremock (protocol scenarios 27–36, 43, 46–50).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use volcano::{Error, LeaseClock, LostReason};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

const TTL: Duration = Duration::from_secs(5);

async fn happy_server() -> MockServer {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 7)).await;
    mount(&server, "PATCH", lease_body(200, 8)).await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    server
}

#[derive(Debug)]
enum JobError {
    Lock(Error),
    Job(&'static str),
}

impl From<Error> for JobError {
    fn from(err: Error) -> Self {
        JobError::Lock(err)
    }
}

fn lost_reason(err: &JobError) -> LostReason {
    match err {
        JobError::Lock(Error::LockLost(lost)) => lost.reason(),
        other => panic!("expected LockLost, got {other:?}"),
    }
}

/// Protocol scenario 33.
#[tokio::test]
async fn returns_the_value_and_releases_with_the_acquired_token() {
    let server = happy_server().await;
    let client = client(&server.uri());
    let value = client
        .locks()
        .with_lock("job", TTL, |guard| async move {
            assert!(!guard.is_lost());
            assert_eq!(guard.ttl(), TTL);
            assert_eq!(guard.key(), "job");
            Ok::<_, Error>(guard.lease().fencing_token())
        })
        .token(TOKEN)
        .request_id(REQUEST_ID)
        .await
        .unwrap();
    assert_eq!(value, 7);
    let requests = received(&server).await;
    assert_eq!(methods(&server).await, ["POST", "DELETE"]);
    assert_eq!(
        header(&requests[0], "x-volcano-request-id"),
        Some(REQUEST_ID)
    );
    assert_eq!(header(&requests[1], "x-volcano-lock-token"), Some(TOKEN));
    assert_ne!(
        header(&requests[1], "x-volcano-request-id"),
        Some(REQUEST_ID),
        "release uses a fresh request id"
    );
    assert_eq!(client.active_renewals(), 0);
}

/// Protocol scenario 32.
#[tokio::test]
async fn the_closures_error_propagates_and_release_still_happens() {
    let server = happy_server().await;
    let err = client(&server.uri())
        .locks()
        .with_lock("job", TTL, |_guard| async {
            Err::<(), _>(JobError::Job("boom"))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, JobError::Job("boom")), "{err:?}");
    assert_eq!(methods(&server).await, ["POST", "DELETE"]);
}

/// Protocol scenario 34.
#[tokio::test]
async fn short_ttl_sends_nothing() {
    let server = server().await;
    let ran = AtomicBool::new(false);
    let err = client(&server.uri())
        .locks()
        .with_lock("job", Duration::from_secs(4), |_guard| async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst));
    assert!(received(&server).await.is_empty());
}

#[tokio::test]
async fn contention_is_a_conflict_and_the_closure_does_not_run() {
    let server = server().await;
    mount(
        &server,
        "POST",
        error_body(409, "Lock is held", Some("lock_held")),
    )
    .await;
    let err = client(&server.uri())
        .locks()
        .with_lock("job", TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    assert_eq!(methods(&server).await, ["POST"]);
}

/// Protocol scenario 27.
#[tokio::test]
async fn slow_acquire_renews_before_running_the_closure() {
    let server = server().await;
    let clock = LeaseClock::adjustable();
    let slow = AdvanceThen {
        clock: clock.clone(),
        by: Duration::from_millis(3_500),
        response: lease_body(201, 7),
    };
    mount(&server, "POST", slow).await;
    mount(&server, "PATCH", lease_body(200, 8)).await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let fence = client_with_clock(&server.uri(), &clock)
        .locks()
        .with_lock("job", TTL, |guard| async move {
            Ok::<_, Error>(guard.lease().fencing_token())
        })
        .await
        .unwrap();
    assert_eq!(fence, 8, "the closure sees the renewed lease");
    assert_eq!(methods(&server).await, ["POST", "PATCH", "DELETE"]);
}

/// Protocol scenario 28.
#[tokio::test]
async fn rejected_pre_run_renewal_skips_the_closure_and_releases() {
    let server = server().await;
    let clock = LeaseClock::adjustable();
    let slow = AdvanceThen {
        clock: clock.clone(),
        by: Duration::from_millis(3_500),
        response: lease_body(201, 7),
    };
    mount(&server, "POST", slow).await;
    mount(
        &server,
        "PATCH",
        error_body(409, "Lock ownership lost", Some("lock_ownership_lost")),
    )
    .await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let ran = AtomicBool::new(false);
    let err = client_with_clock(&server.uri(), &clock)
        .locks()
        .with_lock("job", TTL, |_guard| async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, JobError>(())
        })
        .await
        .unwrap_err();
    assert_eq!(lost_reason(&err), LostReason::RenewalFailed);
    let JobError::Lock(err) = err else {
        unreachable!()
    };
    assert_eq!(err.status(), Some(409));
    assert!(err.is_ownership_lost());
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(methods(&server).await, ["POST", "PATCH", "DELETE"]);
}

/// Protocol scenario 29.
#[tokio::test]
async fn pre_run_renewal_without_a_safe_window_skips_the_closure() {
    let server = server().await;
    let clock = LeaseClock::adjustable();
    mount(
        &server,
        "POST",
        AdvanceThen {
            clock: clock.clone(),
            by: Duration::from_millis(3_500),
            response: lease_body(201, 7),
        },
    )
    .await;
    mount(
        &server,
        "PATCH",
        AdvanceThen {
            clock: clock.clone(),
            by: Duration::from_secs(4),
            response: lease_body(200, 7),
        },
    )
    .await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let ran = AtomicBool::new(false);
    let err = client_with_clock(&server.uri(), &clock)
        .locks()
        .with_lock("job", TTL, |_guard| async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, JobError>(())
        })
        .await
        .unwrap_err();
    assert_eq!(lost_reason(&err), LostReason::NoSafeWindow);
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(methods(&server).await, ["POST", "PATCH", "DELETE"]);
}

/// Protocol scenario 30.
#[tokio::test]
async fn background_renewal_updates_the_lease_and_release_uses_it() {
    let server = happy_server().await;
    let clock = LeaseClock::adjustable();
    let client = client_with_clock(&server.uri(), &clock);
    client
        .locks()
        .with_lock("job", TTL, |guard| {
            let clock = clock.clone();
            let client = client.clone();
            async move {
                assert_eq!(guard.lease().fencing_token(), 7);
                clock.advance(Duration::from_secs(2)); // past the first renewal time
                let renewed = eventually(Duration::from_secs(3), || {
                    guard.lease().fencing_token() == 8
                })
                .await;
                assert!(renewed, "the renewal task replaced the lease");
                assert_eq!(client.active_renewals(), 1);
                assert!(!guard.is_lost());
                Ok::<_, Error>(())
            }
        })
        .token(TOKEN)
        .await
        .unwrap();
    let requests = received(&server).await;
    assert_eq!(methods(&server).await, ["POST", "PATCH", "DELETE"]);
    assert_eq!(header(&requests[1], "x-volcano-lock-token"), Some(TOKEN));
    assert_eq!(requests[1].body, br#"{"ttl_seconds":5}"#);
    assert_eq!(header(&requests[2], "x-volcano-lock-token"), Some(TOKEN));
    let ids: Vec<_> = requests
        .iter()
        .map(|r| header(r, "x-volcano-request-id").unwrap())
        .collect();
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2],
        "fresh request ids: {ids:?}"
    );
    assert_eq!(client.active_renewals(), 0);
}

/// Protocol scenario 31.
#[tokio::test]
async fn definitive_renewal_failure_marks_lost_and_is_reported_after_the_closure() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 7)).await;
    mount(&server, "PATCH", error_body(403, "forbidden", None)).await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let clock = LeaseClock::adjustable();
    let err = client_with_clock(&server.uri(), &clock)
        .locks()
        .with_lock("job", TTL, |guard| {
            let clock = clock.clone();
            async move {
                clock.advance(Duration::from_secs(2));
                assert!(guard.wait_lost(Duration::from_secs(3)).await);
                Ok::<_, JobError>("finished anyway")
            }
        })
        .await
        .unwrap_err();
    assert_eq!(lost_reason(&err), LostReason::RenewalFailed);
    let JobError::Lock(err) = err else {
        unreachable!()
    };
    assert_eq!(err.status(), Some(403), "the cause is kept");
    assert_eq!(
        methods(&server).await,
        ["POST", "PATCH", "DELETE"],
        "403 is not retried"
    );
}

#[tokio::test]
async fn transient_renewal_failures_are_retried_within_the_window() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 7)).await;
    Mock::given(method("PATCH"))
        .respond_with(error_body(500, "oops", None))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("PATCH"))
        .respond_with(error_body(429, "slow down", Some("lock_rate_limited")))
        .up_to_n_times(1)
        .with_priority(2)
        .mount(&server)
        .await;
    mount(&server, "PATCH", lease_body(200, 7)).await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let clock = LeaseClock::adjustable();
    client_with_clock(&server.uri(), &clock)
        .locks()
        .with_lock("job", Duration::from_secs(30), |guard| {
            let clock = clock.clone();
            let server = &server;
            async move {
                // Past the first renewal time (half the ttl, +10 %).
                clock.advance(Duration::from_secs(17));
                let mut renewed = false;
                for _ in 0..300 {
                    if received(server).await.len() >= 5 {
                        renewed = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert!(
                    renewed,
                    "500, 500, 429, then 200: {:?} lost={:?}",
                    methods(server).await,
                    guard.failure()
                );
                assert!(!guard.is_lost(), "transient failures did not lose the lock");
                Ok::<_, Error>(())
            }
        })
        .await
        .unwrap();
    assert_eq!(
        methods(&server).await,
        ["POST", "PATCH", "PATCH", "PATCH", "PATCH", "DELETE"]
    );
}

/// Protocol scenario 35.
#[tokio::test]
async fn renewal_that_hangs_past_the_deadline_loses_the_lock_in_time() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 7)).await;
    mount(
        &server,
        "PATCH",
        lease_body(200, 7).set_delay(Duration::from_secs(30)),
    )
    .await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let started = tokio::time::Instant::now();
    let err = client(&server.uri())
        .locks()
        .with_lock("job", TTL, |guard| async move {
            guard.lost().await;
            let lost_after = started.elapsed();
            assert!(
                lost_after < TTL,
                "lost after {lost_after:?}, before the 5 s deadline"
            );
            Ok::<_, JobError>(())
        })
        .await
        .unwrap_err();
    let JobError::Lock(Error::LockLost(lost)) = &err else {
        panic!("expected LockLost, got {err:?}")
    };
    assert_eq!(lost.reason(), LostReason::Expired);
    assert!(
        lost.cause().is_some_and(Error::is_transport),
        "timed out: {lost:?}"
    );
    assert_eq!(
        methods(&server).await.last().map(String::as_str),
        Some("DELETE")
    );
}

/// Protocol scenario 36.
#[tokio::test]
async fn hung_renewal_does_not_hold_up_a_finished_closure() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 7)).await;
    mount(
        &server,
        "PATCH",
        lease_body(200, 7).set_delay(Duration::from_secs(30)),
    )
    .await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let clock = LeaseClock::adjustable();
    let client = client_with_clock(&server.uri(), &clock);
    let started = tokio::time::Instant::now();
    let value = client
        .locks()
        .with_lock("job", TTL, |_guard| {
            let clock = clock.clone();
            let server = &server;
            async move {
                clock.advance(Duration::from_secs(2));
                for _ in 0..300 {
                    if received(server).await.len() >= 2 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok::<_, Error>(42)
            }
        })
        .await
        .unwrap();
    assert_eq!(value, 42);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "did not wait for the renewal"
    );
    assert_eq!(methods(&server).await, ["POST", "PATCH", "DELETE"]);
    assert_eq!(client.active_renewals(), 0);
}

/// Protocol scenarios 37–41.
#[tokio::test]
async fn suspend_beyond_the_ttl_is_noticed_without_any_task() {
    let server = happy_server().await;
    let clock = LeaseClock::adjustable();
    let err = client_with_clock(&server.uri(), &clock)
        .locks()
        .with_lock("job", TTL, |guard| {
            let clock = clock.clone();
            async move {
                assert!(!guard.is_lost());
                assert!(!guard.wait_lost(Duration::ZERO).await, "scenario 50");
                clock.advance(Duration::from_secs(6)); // the machine slept 6 s
                                                       // No await in between: the check reads the clock itself.
                assert!(guard.is_lost());
                assert!(*guard.watch().borrow());
                assert_eq!(guard.failure().unwrap().reason(), LostReason::Expired);
                Ok::<_, JobError>(())
            }
        })
        .await
        .unwrap_err();
    assert_eq!(lost_reason(&err), LostReason::Expired);
    assert_eq!(
        methods(&server).await,
        ["POST", "DELETE"],
        "no renewal after the deadline"
    );
}

/// Protocol scenario 43.
#[tokio::test]
async fn slow_release_after_the_closure_is_not_an_expiry() {
    let server = server().await;
    let clock = LeaseClock::adjustable();
    mount(&server, "POST", lease_body(201, 7)).await;
    mount(
        &server,
        "DELETE",
        AdvanceThen {
            clock: clock.clone(),
            by: Duration::from_secs(10),
            response: ResponseTemplate::new(204),
        },
    )
    .await;
    let value = client_with_clock(&server.uri(), &clock)
        .locks()
        .with_lock("job", TTL, |_guard| async { Ok::<_, Error>("done") })
        .await
        .unwrap();
    assert_eq!(value, "done");
}

/// Protocol scenarios 46–49.
#[tokio::test]
async fn outcome_precedence() {
    async fn run(mark: bool, fail: bool) -> Result<&'static str, JobError> {
        let server = server().await;
        mount(&server, "POST", lease_body(201, 7)).await;
        mount(&server, "DELETE", error_body(500, "release failed", None)).await;
        let client = client(&server.uri());
        let result = client
            .locks()
            .with_lock("job", TTL, |guard| async move {
                if mark {
                    guard.mark_lost("fencing check failed");
                }
                if fail {
                    return Err(JobError::Job("job failed"));
                }
                Ok("value")
            })
            .await;
        // A 500 is transient: the idempotent release is tried 3 times, then
        // handed to the background, where it goes on while the lease may
        // still be live.
        let methods = methods(&server).await;
        assert_eq!(methods[..4], ["POST", "DELETE", "DELETE", "DELETE"]);
        assert_eq!(client.shutdown(Duration::ZERO).await, ["job"]);
        // Let it finish, so it cannot reach the next run's (pooled) server.
        Mock::given(method("DELETE"))
            .respond_with(ResponseTemplate::new(204))
            .with_priority(1)
            .mount(&server)
            .await;
        assert!(client.shutdown(Duration::from_secs(10)).await.is_empty());
        result
    }
    // 46: release error when nothing else went wrong.
    match run(false, false).await.unwrap_err() {
        JobError::Lock(err) => assert_eq!(err.status(), Some(500)),
        other @ JobError::Job(_) => panic!("{other:?}"),
    }
    // 47 and 49: the closure's error wins over release failure and loss.
    assert!(matches!(
        run(false, true).await.unwrap_err(),
        JobError::Job("job failed")
    ));
    assert!(matches!(
        run(true, true).await.unwrap_err(),
        JobError::Job("job failed")
    ));
    // 48: a recorded loss wins over the release failure.
    let err = run(true, false).await.unwrap_err();
    assert_eq!(lost_reason(&err), LostReason::Marked);
    assert!(format!("{err:?}").contains("fencing check failed"));
}

#[tokio::test]
async fn a_transient_release_failure_is_tried_again() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 7)).await;
    Mock::given(method("DELETE"))
        .respond_with(error_body(
            503,
            "Lock service unavailable",
            Some("lock_service_unavailable"),
        ))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    mount(&server, "DELETE", ResponseTemplate::new(204)).await;
    let value = client(&server.uri())
        .locks()
        .with_lock("job", TTL, |_guard| async { Ok::<_, Error>("ok") })
        .await
        .unwrap();
    assert_eq!(value, "ok");
    let requests = received(&server).await;
    assert_eq!(methods(&server).await, ["POST", "DELETE", "DELETE"]);
    assert_eq!(
        header(&requests[1], "x-volcano-request-id"),
        header(&requests[2], "x-volcano-request-id"),
        "one logical release, one request id"
    );
}

#[tokio::test]
async fn a_definitive_release_failure_is_not_retried() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 7)).await;
    mount(
        &server,
        "DELETE",
        error_body(409, "Lock ownership lost", Some("lock_ownership_lost")),
    )
    .await;
    let err = client(&server.uri())
        .locks()
        .with_lock("job", TTL, |_guard| async { Ok::<_, Error>(()) })
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409));
    assert_eq!(methods(&server).await, ["POST", "DELETE"]);
}

/// Protocol scenario 54.
#[tokio::test]
async fn lost_wakes_on_mark_lost_and_all_signals_agree() {
    let server = happy_server().await;
    client(&server.uri())
        .locks()
        .with_lock("job", Duration::from_secs(30), |guard| async move {
            let mut watch = guard.watch();
            assert!(!*watch.borrow());
            let waiter = {
                let guard = guard.clone();
                tokio::spawn(async move { guard.wait_lost(Duration::from_secs(10)).await })
            };
            let selected = {
                let guard = guard.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = guard.lost() => "lost",
                        _ = tokio::time::sleep(Duration::from_secs(10)) => "timeout",
                    }
                })
            };
            tokio::task::yield_now().await;
            guard.mark_lost("checked by the test");
            assert!(waiter.await.unwrap());
            assert_eq!(selected.await.unwrap(), "lost");
            watch.changed().await.unwrap();
            assert!(*watch.borrow());
            assert_eq!(guard.failure().unwrap().reason(), LostReason::Marked);
            Ok::<_, JobError>(())
        })
        .await
        .unwrap_err();
}

/// Protocol scenario 56.
#[tokio::test]
async fn a_loss_recorded_while_waiting_means_no_renewal_is_sent() {
    let server = happy_server().await;
    let clock = LeaseClock::adjustable();
    let client = client_with_clock(&server.uri(), &clock);
    let _ = client
        .locks()
        .with_lock("job", TTL, |guard| {
            let clock = clock.clone();
            let client = client.clone();
            async move {
                guard.mark_lost("stop");
                clock.advance(Duration::from_secs(2));
                assert!(
                    eventually(Duration::from_secs(3), || client.active_renewals() == 0).await,
                    "the renewal task ends once the loss is recorded"
                );
                Ok::<_, Error>(())
            }
        })
        .await;
    assert_eq!(methods(&server).await, ["POST", "DELETE"]);
}

#[tokio::test]
async fn guard_clones_outliving_the_scope_see_it_ended() {
    let server = happy_server().await;
    let kept = client(&server.uri())
        .locks()
        .with_lock("job", Duration::from_secs(30), |guard| async move {
            Ok::<_, Error>(guard.clone())
        })
        .await
        .unwrap();
    assert!(kept.is_lost());
    assert_eq!(kept.failure().unwrap().reason(), LostReason::Released);
}
