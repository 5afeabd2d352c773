//! An apalis 1.0 worker on each of two hosts, both fed the same jobs (a
//! search index to rebuild per tenant, scheduled on both): with
//! `volcano::tower::LockLayer` keyed by tenant, a tenant's rebuild never
//! runs on two hosts at once. A job that finds its tenant's lock held
//! fails with "held", and apalis's retry policy runs it again later (only
//! that error is retried, after a pause).
//!
//! ```sh
//! cargo run --example apalis_jobs
//! ```
//!
//! On an in-process mock lock server unless `VOLCANO_API_URL` or
//! `VOLCANO_SERVICE_KEY` is set (keys `volcano-example-rebuild-N` then).
//! Exits non-zero if the story did not happen: two rebuilds of a tenant at
//! once, a job that never ran, or no job ever found its lock held.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apalis::layers::retry::backoff::Backoff;
use apalis::prelude::*;
use tokio::time::Instant;
use volcano::mock::MockServer;
use volcano::tower::LockLayer;
use volcano::Client;

/// A job: rebuild one tenant's search index.
#[derive(Clone, Debug)]
struct Rebuild {
    tenant: u32,
}

const TENANTS: [u32; 3] = [1, 2, 3];

/// What ran where: each rebuild's tenant, host and time; how many jobs
/// found their lock held.
#[derive(Default)]
struct Ledger {
    runs: Mutex<Vec<(u32, &'static str, Instant, Instant)>>,
    held: AtomicUsize,
}

/// One host's view: its name, its jobs done, the shared ledger.
#[derive(Clone)]
struct Host {
    name: &'static str,
    done: Arc<AtomicUsize>,
    ledger: Arc<Ledger>,
}

/// The job itself. Under its tenant's lock: `volcano::tower::guard()`
/// gives the fencing token to hand to the index store.
async fn rebuild(job: Rebuild, host: Data<Host>, worker: WorkerContext) -> Result<(), BoxDynError> {
    let Some(guard) = volcano::tower::guard() else {
        return Err("a job ran without its lock".into());
    };
    let fence = guard.lease().fencing_token();
    let began = Instant::now();
    tokio::time::sleep(Duration::from_millis(800)).await;
    println!(
        "{}: rebuilt tenant {} (fencing token {fence})",
        host.name, job.tenant
    );
    host.ledger
        .runs
        .lock()
        .unwrap()
        .push((job.tenant, host.name, began, Instant::now()));
    if host.done.fetch_add(1, Ordering::SeqCst) + 1 == TENANTS.len() {
        // Every job of this host ran: the worker may stop.
        worker.stop()?;
    }
    Ok(())
}

/// apalis's retry pause: a fixed wait before a job runs again.
#[derive(Clone)]
struct Later(Duration);

impl Backoff for Later {
    type Future = tokio::time::Sleep;

    fn next_backoff(&mut self) -> Self::Future {
        tokio::time::sleep(self.0)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxDynError> {
    let (mock, prefix) = if configured() {
        (None, "volcano-example-rebuild")
    } else {
        (Some(MockServer::start().await), "rebuild")
    };
    let ledger = Arc::new(Ledger::default());
    let mut hosts = Vec::new();
    let mut clients = Vec::new();
    for name in ["host-a", "host-b"] {
        let client = match &mock {
            Some(server) => Client::for_mock(server),
            None => Client::from_env()?,
        };
        let mut jobs = MemoryStorage::new();
        for tenant in TENANTS {
            jobs.push(Rebuild { tenant }).await?;
        }
        let counted = ledger.clone();
        // Retry "held" only (a real failure is not hidden), up to 20
        // times, 500 ms apart: each try is one acquire request.
        let retry = RetryPolicy::retries(20)
            .with_backoff(Later(Duration::from_millis(500)))
            .retry_if(move |err: &BoxDynError| {
                let held = err
                    .downcast_ref::<volcano::Error>()
                    .is_some_and(volcano::Error::is_lock_held);
                if held {
                    counted.held.fetch_add(1, Ordering::SeqCst);
                }
                held
            });
        let worker = WorkerBuilder::new(name)
            .backend(jobs)
            .data(Host {
                name,
                done: Arc::default(),
                ledger: ledger.clone(),
            })
            // Outermost first: each retry takes the lock anew.
            .retry(retry)
            .layer(LockLayer::new(
                client.locks(),
                Duration::from_secs(30),
                move |task: &Task<Rebuild>| format!("{prefix}-{}", task.args.tenant),
            ))
            .build(rebuild);
        hosts.push(tokio::spawn(worker.run()));
        clients.push(client);
    }
    for host in hosts {
        tokio::time::timeout(Duration::from_secs(60), host).await???;
    }
    for client in clients {
        client.shutdown(Duration::from_secs(10)).await;
    }

    let runs = ledger.runs.lock().unwrap().clone();
    let held = ledger.held.load(Ordering::SeqCst);
    let overlapping = TENANTS.iter().any(|tenant| {
        let mut spans: Vec<_> = runs
            .iter()
            .filter(|r| r.0 == *tenant)
            .map(|r| (r.2, r.3))
            .collect();
        spans.sort();
        spans.windows(2).any(|w| w[1].0 < w[0].1)
    });
    println!(
        "{} rebuilds on 2 hosts, {held} tries found their tenant's lock held and ran later; \
         two of one tenant at once: {overlapping}",
        runs.len()
    );
    if overlapping || runs.len() != 2 * TENANTS.len() || held == 0 {
        return Err("the story did not happen".into());
    }
    Ok(())
}

/// Whether the environment names a lock service (else the mock is used).
fn configured() -> bool {
    [volcano::ENV_API_URL, volcano::ENV_SERVICE_KEY]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
