//! The testing guide's patterns, from the packaged crates.

use std::time::Duration;

use volcano::mock::{Fault, MockServer, Operation};
use volcano::Client;

#[path = "../src/main.rs"]
#[allow(dead_code)]
mod app;

#[tokio::test]
async fn the_report_runs_once_and_skips_while_another_worker_holds_the_lock() {
    let server = MockServer::start().await;
    let client = Client::for_mock(&server);
    let store = volcano_fence::Gate::new();

    // A 503 on the first acquire is retried once, with the same token.
    server.inject(Fault::status(503).on(Operation::Acquire).times(1));
    let fence = app::nightly(&client, &store).await.unwrap().expect("ran");
    assert_eq!(store.highest_seen("nightly-report"), Some(fence));

    let other = client
        .locks()
        .acquire("nightly-report", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(app::nightly(&client, &store).await.unwrap().is_none());
    client.locks().release(&other).await.unwrap();
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
}
