//! What an application logging at INFO sees: one line when a lock is taken
//! (`lock acquired`, with key, fencing token, host and pid: how an operator
//! finds a holder), nothing for routine renewals and releases (DEBUG), a
//! WARN for a failure that is retried and for a loss.
//!
//! Its own test binary: a thread-scoped subscriber misses events whose
//! callsites other test threads registered first.

mod common;

use std::time::Duration;

use common::{mock_client, Captured};
use volcano::Error;
use volcano_mock_server::{Fault, MockServer, Operation};

#[tokio::test(flavor = "current_thread")]
async fn routine_work_is_quiet_at_info_and_failures_warn() {
    let (captured, _default) = Captured::install(tracing::Level::INFO);
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();

    // Acquire, a renewal, release: nothing at INFO.
    let renewed = locks
        .with_lock("quiet", Duration::from_secs(5), |_guard| async {
            Ok::<_, Error>(
                server
                    .wait_for(Operation::Renew, 200, Duration::from_secs(10))
                    .await
                    .is_some(),
            )
        })
        .await
        .unwrap();
    assert!(renewed);
    let held = locks.hold("quiet", Duration::from_secs(5)).await.unwrap();
    held.release().await.unwrap();
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|r| r.operation == Operation::Release)
            .count(),
        2
    );
    // One line a lock taken, naming its holder; renewals and releases
    // say nothing.
    let all = captured.lines("");
    assert_eq!(all.len(), 2, "{all:?}");
    for line in &all {
        assert!(
            line.contains("INFO") && line.contains("lock acquired"),
            "{line}"
        );
        for field in ["key=quiet", "fencing_token=", "host=", "pid="] {
            assert!(line.contains(field), "{field}: {line}");
        }
    }

    // A renewal refused for good: its loss is a WARN.
    server.inject(Fault::status(409).on(Operation::Renew));
    let err = locks
        .with_lock("lost", Duration::from_secs(5), |guard| async move {
            guard.lost().await;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LockLost(_)), "{err}");
    let lost = captured.lines("lock lost");
    assert!(
        lost.iter().all(|l| l.contains("WARN")) && !lost.is_empty(),
        "{lost:?}"
    );
}
