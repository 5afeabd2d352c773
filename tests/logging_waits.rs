//! A waiting acquire whose tries cannot reach the service logs what really
//! happened (could not connect), never "lock held", and times out with
//! that error: a leader that cannot reach the service must not look like
//! a patient standby.
//!
//! Its own test binary: a thread-scoped subscriber misses events whose
//! callsites other test threads registered first.

mod common;

use std::time::Duration;

use common::{client, Captured};

#[tokio::test(flavor = "current_thread")]
async fn a_wait_that_cannot_connect_says_so_and_is_not_lock_held() {
    let (captured, _default) = Captured::install(tracing::Level::DEBUG);
    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let locks = client(&format!("http://127.0.0.1:{port}")).locks();
    let err = locks
        .acquire("job", Duration::from_secs(30))
        .wait(Duration::from_millis(1500))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, volcano::Error::Transport(t) if t.is_connect()),
        "{err:?}"
    );
    assert!(!err.is_lock_held());
    let failed = captured.lines("acquire failed; trying again");
    assert!(!failed.is_empty(), "each failed try is logged");
    assert!(
        failed.iter().all(|line| line.contains("could not connect")),
        "{failed:?}"
    );
    assert!(
        captured.lines("lock held; waiting").is_empty(),
        "nothing said the lock is held"
    );
}
