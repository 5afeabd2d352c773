//! Run the nightly report once across workers (the README's
//! `try_with_lock`), writing through a fence.

use std::time::Duration;

use volcano::Client;
use volcano_fence::Gate;

/// What the job can fail with: the closure's error type needs
/// `From<volcano::Error>`.
#[derive(Debug)]
pub enum JobError {
    /// The lock service, or the lock was lost.
    Lock(volcano::Error),
    /// The store refused a stale fence.
    Stale(volcano_fence::Error),
}

impl From<volcano::Error> for JobError {
    fn from(e: volcano::Error) -> Self {
        JobError::Lock(e)
    }
}

/// Runs the job if no other worker holds the lock: `Some(fence)` when it
/// ran, `None` when another worker had it.
pub async fn nightly(client: &Client, store: &Gate) -> Result<Option<i64>, JobError> {
    client
        .locks()
        .try_with_lock("nightly-report", Duration::from_secs(60), |guard| async move {
            let fence = guard.lease().fencing_token();
            store
                .write("nightly-report", fence, || ())
                .map_err(JobError::Stale)?;
            Ok(fence)
        })
        .await
}

#[tokio::main]
async fn main() {
    let client = match Client::from_env() {
        Ok(client) => client,
        Err(e) => return eprintln!("newcomer: {e}"),
    };
    match nightly(&client, &Gate::new()).await {
        Ok(Some(fence)) => println!("report written under fence {fence}"),
        Ok(None) => println!("another worker has it; skipped"),
        Err(e) => eprintln!("newcomer: {e:?}"),
    }
    client.shutdown(Duration::from_secs(5)).await;
}
