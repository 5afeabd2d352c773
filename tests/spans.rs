//! The caller's span follows its lock into the background: renewals and
//! background releases log under it, so a job's fields (a job id) stay on
//! its lock's logs. Its own test binary, for a thread-scoped subscriber.

mod common;

use std::time::Duration;

use common::{eventually, mock_client, Captured};
use tracing::Instrument;
use volcano::Error;
use volcano_mock_server::MockServer;

const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "current_thread")]
async fn renewals_and_background_releases_log_under_the_callers_span() {
    let (captured, _default) = Captured::install(tracing::Level::DEBUG);

    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();

    // hold: acquired inside the job's span, then kept outside it.
    let job = tracing::info_span!("job", job_id = 42);
    let held = async { locks.hold("ingest", TTL).await }
        .instrument(job)
        .await
        .unwrap();
    let fence = held.lease().fencing_token();
    let renewed = || !captured.lines("lock renewed").is_empty();
    assert!(eventually(Duration::from_secs(5), renewed).await);
    for line in captured.lines("lock renewed") {
        assert!(line.contains("job{job_id=42}"), "{line}");
        assert!(
            line.contains(&format!("volcano.hold{{key=ingest fencing_token={fence}}}")),
            "{line}"
        );
    }
    drop(held); // released in the background, still under the job's span
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    let released = captured.lines("lock released in the background");
    assert_eq!(released.len(), 1, "{released:?}");
    assert!(released[0].contains("job{job_id=42}"), "{}", released[0]);

    // with_lock: one span for the scope, under the caller's.
    let report = tracing::info_span!("report", run = 7);
    async {
        locks
            .with_lock("report", TTL, |_guard| async {
                let renewed = || {
                    captured
                        .lines("lock renewed")
                        .iter()
                        .any(|l| l.contains("volcano.with_lock{key=report"))
                };
                assert!(eventually(Duration::from_secs(5), renewed).await);
                Ok::<_, Error>(())
            })
            .await
    }
    .instrument(report)
    .await
    .unwrap();
    let scoped: Vec<String> = captured
        .lines("lock renewed")
        .into_iter()
        .filter(|l| l.contains("volcano.with_lock"))
        .collect();
    assert!(!scoped.is_empty());
    for line in scoped {
        assert!(line.contains("report{run=7}"), "{line}");
    }
}
