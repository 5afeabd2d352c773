//! Logs of a full scoped-lock run with failures: they tell the story
//! (acquired, renewal retry, renewed, lost, released, with key, fencing
//! token and request id) and never contain the service key or a token.
//!
//! Its own test binary: a thread-scoped subscriber misses events whose
//! callsites other test threads registered first.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, mock_client};
use volcano::Error;
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);

/// Captures everything logged on this thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn logs_tell_the_story_without_secrets() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let server = MockServer::builder()
        .service_key("svc-SECRET-key-for-log-test")
        .start()
        .await;
    server.inject(Fault::status(503).on(Operation::Renew).times(1));
    server.inject(Fault::status(503).on(Operation::Acquire).times(1));
    let token = "AAAAAAAA-1111-4222-8333-BBBBBBBBBBBB";
    let locks = mock_client(&server).locks();
    let log = captured.clone();
    let logged = move |what: &str| String::from_utf8_lossy(&log.0.lock().unwrap()).contains(what);
    let err = locks
        .with_lock("job", TTL, |guard| async move {
            assert!(eventually(Duration::from_secs(8), || logged("lock renewed")).await);
            guard.mark_lost("test says so");
            Ok::<_, Error>(())
        })
        .token(token)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LockLost(_)));

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    for expected in [
        "retrying acquire",
        "lock acquired",
        "renewal failed; retrying",
        "lock renewed",
        "lock lost",
        "lock released",
        "fencing_token=1",
        "request_id=",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    for secret in [server.service_key(), token, &token.to_lowercase()] {
        assert!(!text.contains(secret), "{secret} leaked in:\n{text}");
    }
}
