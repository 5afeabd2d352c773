//! Logs of a full scoped-lock run with failures: they tell the story
//! (acquired, renewal retry, renewed, lost, released, with key, fencing
//! token and request id) and never contain the service key or a token.
//!
//! Its own test binary: a thread-scoped subscriber misses events whose
//! callsites other test threads registered first.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, mock_client, Captured};
use volcano::Error;
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "current_thread")]
async fn logs_tell_the_story_without_secrets() {
    let (captured, _default) = Captured::install(tracing::Level::TRACE);

    let server = MockServer::builder()
        .service_key("svc-SECRET-key-for-log-test")
        .start()
        .await;
    server.inject(Fault::status(503).on(Operation::Renew).times(1));
    server.inject(Fault::status(503).on(Operation::Acquire).times(1));
    let token = "AAAAAAAA-1111-4222-8333-BBBBBBBBBBBB";
    let locks = mock_client(&server).locks();
    let log = captured.clone();
    let logged = move |what: &str| !log.lines(what).is_empty();
    server.inject(Fault::drop_response().on(Operation::Release).times(1));
    let shown = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = shown.clone();
    let scoped = locks
        .with_lock("job", TTL, |guard| async move {
            assert!(eventually(Duration::from_secs(8), || logged("lock renewed")).await);
            guard.mark_lost("test says so");
            let mut seen = seen.lock().unwrap();
            seen.push(format!("{guard:?}"));
            seen.push(format!("{:?}", guard.lease()));
            seen.push(format!(
                "{:?} {}",
                guard.failure().unwrap(),
                guard.failure().unwrap()
            ));
            Ok::<_, Error>(())
        })
        .token(token);
    shown.lock().unwrap().push(format!("{scoped:?}"));
    let err = scoped.await.unwrap_err();
    assert!(matches!(err, Error::LockLost(_)));

    // Every builder, the client, and the error chain.
    let lease = volcano::LockLease::new("job", token, chrono::Utc::now(), 1);
    let client = mock_client(&server);
    let mut shown = shown.lock().unwrap().clone();
    shown.extend([
        format!("{client:?}"),
        format!("{:?}", client.locks()),
        format!("{:?}", locks.acquire("job", TTL).token(token)),
        format!("{:?}", locks.renew(&lease, TTL)),
        format!("{:?}", locks.release(&lease)),
        format!("{:?}", locks.get("job")),
        format!("{:?}", locks.force_release("job")),
        format!("{err:?}"),
        err.to_string(),
    ]);
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        shown.push(format!("{cause:?} {cause}"));
        source = cause.source();
    }
    let renewal_conflict = locks.renew(&lease, TTL).await.unwrap_err();
    shown.push(format!("{renewal_conflict:?} {renewal_conflict}"));

    let mut text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    text.push_str(&shown.join("\n"));
    for expected in [
        "retrying acquire",
        "lock acquired",
        "renewal failed; retrying",
        "lock renewed",
        "lock lost",
        "lock released",
        "release failed; retrying",
        "fencing_token=1",
        "request_id=",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    for secret in [server.service_key(), token, &token.to_lowercase()] {
        assert!(!text.contains(secret), "{secret} leaked in:\n{text}");
    }
}
