//! The README's and guides' code blocks, compiled.
//!
//! Every `rust` code block of `README.md` (in `readme.rs`),
//! `docs/guide/*.md` (in `guides.rs`) and `docs/testing.md` (in
//! `testing.rs`) appears there, verbatim once its
//! common indentation is removed, as the body of one `snippet_*` function
//! (the comment above each names where it comes from). The functions are never called: compiling them checks that each
//! block uses the API as it is. The helpers stand for your own code: the
//! store, the job, the error type. `#[rustfmt::skip]` keeps each block as
//! the page shows it.
#![allow(dead_code, unused, clippy::all, clippy::pedantic)]

use std::sync::Arc;
use std::time::Duration;

use volcano::LeaderStatus;

/// The error type of the jobs: `with_lock` and the others need
/// `From<volcano::Error>`, so that the lock's own failures arrive in it.
#[derive(Debug)]
enum MyError {
    /// The lock service, or a lost lock.
    Lock(volcano::Error),
    /// The job saw its guard lost and stopped.
    Lost,
    /// The store refused a stale fencing token.
    Stale,
}

impl From<volcano::Error> for MyError {
    fn from(err: volcano::Error) -> Self {
        MyError::Lock(err)
    }
}

/// A store that rejects writes with a fencing token lower than the highest
/// it has seen.
struct Store;

impl Store {
    fn new() -> Self {
        Store
    }

    fn write(&self, data: &[u8], fence: i64) -> Result<(), MyError> {
        let _ = (data, fence);
        Ok(())
    }
}

/// A job: a unit of work a leader runs.
struct Job;

async fn write_report(fence: i64) -> Result<(), MyError> {
    let _ = fence;
    Ok(())
}

async fn run_report(fence: i64) -> Result<u64, MyError> {
    let _ = fence;
    Ok(0)
}

fn report_chunks() -> Vec<Vec<u8>> {
    vec![b"first".to_vec(), b"second".to_vec()]
}

async fn ingest(fence: i64) {
    let _ = fence;
}

async fn checkpoint() {}

async fn schedule_jobs(store: &Store, fence: i64) -> Result<(), MyError> {
    store.write(b"schedule", fence)
}

async fn schedule_next(store: &Store, fence: i64) -> Result<(), MyError> {
    store.write(b"next", fence)
}

async fn next_job() -> Job {
    Job
}

async fn run_job(job: Job, fence: i64) -> Result<(), MyError> {
    let _ = (job, fence);
    Ok(())
}

async fn call_partner(key: &str, fence: i64) -> Result<(), MyError> {
    let _ = (key, fence);
    Ok(())
}

async fn transfer(accounts: Option<i64>, ledger: Option<i64>) -> Result<(), MyError> {
    let _ = (accounts, ledger);
    Ok(())
}

async fn my_job(client: volcano::Client) -> Result<(), MyError> {
    let _ = client;
    Ok(())
}

/// An export job, for docs/guide/tower.md.
struct Export {
    id: u64,
}

async fn run_export(export: Export) -> Result<(), std::io::Error> {
    let _ = export.id;
    Ok(())
}

/// What the testing guide's recipes call: your application's code.
mod my_app {
    #[derive(Debug)]
    pub(crate) enum Error {
        LockLost,
        Lock(volcano::Error),
    }

    pub(crate) async fn run_nightly_report(
        client: &volcano::Client,
    ) -> Result<Option<u64>, volcano::Error> {
        let _ = client;
        Ok(None)
    }

    pub(crate) async fn long_job(client: volcano::Client) -> Result<(), Error> {
        let _ = client;
        Ok(())
    }

    pub(crate) async fn write_report(guard: &volcano::LockGuard) -> Result<(), volcano::Error> {
        let _ = guard;
        Ok(())
    }
}

mod guides;
mod readme;
mod testing;

fn main() {}
