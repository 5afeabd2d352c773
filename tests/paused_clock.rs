//! `#[tokio::test(start_paused = true)]`: tokio's clock jumps ahead whenever
//! the runtime waits, while leases are measured in real time. The SDK must
//! say so at once rather than spin (which looks like a hang). A file of its
//! own: a watchdog aborts this test binary if the test hangs after all.

use std::time::Duration;

use volcano::mock::MockServer;
use volcano::{Client, Error};

/// Aborts the process if the test is still running after `limit` of real
/// time: a paused runtime cannot time itself out.
fn watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("the paused-clock test hung for {limit:?}");
        std::process::abort();
    });
}

const PAUSED: &str = "tokio's clock is paused";

#[tokio::test(start_paused = true)]
async fn a_paused_runtime_clock_fails_fast_with_a_message() {
    watchdog(Duration::from_secs(60));
    let server = MockServer::start().await;
    let client = Client::for_mock(&server);
    // Either the acquire's wait for an answer is cut short by the paused
    // clock (a transport error naming the cause), or it completes and the
    // guard's first sleep finds the clock ahead of real time (a loss naming
    // it).
    let job = tokio::spawn(async move {
        client
            .locks()
            .with_lock("job", Duration::from_secs(30), |guard| async move {
                guard.lost().await;
                Ok::<_, Error>(())
            })
            .await
    });
    match job.await.expect("no panic") {
        Err(err @ Error::Transport(_)) => {
            let message = chain(&err);
            assert!(message.contains(PAUSED), "{message}");
            println!("the lock call failed: {message}");
        }
        Err(Error::LockLost(lost)) => {
            assert!(lost.to_string().contains(PAUSED), "{lost}");
            println!("the guard ended: {lost}");
        }
        other => panic!("expected a message about the paused clock, got {other:?}"),
    }
}

/// A waiting acquire does not spin on a paused clock: the error is not
/// one to wait through, and the request is not sent again.
#[tokio::test(start_paused = true)]
async fn a_waiting_acquire_on_a_paused_clock_fails_once_instead_of_spinning() {
    watchdog(Duration::from_secs(60));
    let (server, client) = slow_server(201).await;
    let locks = client.locks();
    let call = tokio::spawn(async move {
        locks
            .acquire("job", Duration::from_secs(30))
            .token("0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10")
            .wait(Duration::MAX)
            .await
    });
    let err = call.await.expect("no panic").expect_err("the call fails");
    assert!(chain(&err).contains(PAUSED), "{err}");
    assert!(!err.is_transient(), "{err:?}");
    // At most the one attempt (a paused clock may cut it before it lands).
    assert!(server.received_requests().await.unwrap().len() <= 1);
}

/// A server that answers `status` after 30 s, and a client with a 5 s
/// timeout for it.
async fn slow_server(status: u16) -> (wiremock::MockServer, Client) {
    use wiremock::{matchers::any, Mock, ResponseTemplate};
    // A server of its own, not one from wiremock's pool: a pooled server
    // handed on from another test here may still record that test's
    // request (sent before its runtime dropped it) after it was reset.
    let server = wiremock::MockServer::builder().start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(status).set_delay(Duration::from_secs(30)))
        .mount(&server)
        .await;
    let client = Client::builder()
        .service_key("service-key")
        .api_url(server.uri())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    (server, client)
}

/// `err` and its sources, as one line.
fn chain(err: &dyn std::error::Error) -> String {
    std::iter::successors(Some(err), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// The lock call itself: its wait for an answer is cut short by the jump.
#[tokio::test(start_paused = true)]
async fn a_request_cut_short_by_a_paused_clock_fails_naming_the_cause() {
    watchdog(Duration::from_secs(60));
    let (_server, client) = slow_server(200).await;
    let call = tokio::spawn(async move { client.locks().get("job").await });
    let err = call.await.expect("no panic").expect_err("the call fails");
    // Sent, and its answer never seen: the outcome is unknown.
    assert!(err.is_transport(), "{err:?}");
    let message = chain(&err);
    assert!(message.contains(PAUSED), "{message}");
}
