//! Leader election: three replicas of a scheduler, one leads. The leader
//! crashes (its runtime stops: no release, no more renewals) and another
//! replica takes over once the dead leader's lease has expired, with a
//! higher fencing token that the job store uses to refuse the dead leader's
//! late writes.
//!
//! ```sh
//! cargo run --example leader     # in-process mock server unless VOLCANO_* is set
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use volcano::mock::MockServer;
use volcano::{Client, Error};

const TTL: Duration = Duration::from_secs(5);

/// Accepts a write only with a fencing token at least as high as the
/// highest it has seen.
#[derive(Default)]
struct JobStore {
    highest: Mutex<i64>,
}

impl JobStore {
    fn schedule(&self, fence: i64, job: &str) -> Result<(), String> {
        let mut highest = self.highest.lock().unwrap();
        if fence < *highest {
            return Err(format!("refused {job}: fence {fence} < {}", *highest));
        }
        *highest = fence;
        Ok(())
    }
}

/// What the replicas report to the story.
type Log = Arc<Mutex<Vec<(String, i64, Instant)>>>;

/// A replica on a runtime of its own, so that it can die like a process.
fn replica(
    name: &'static str,
    client: Client,
    key: &'static str,
    store: Arc<JobStore>,
    log: Log,
) -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.spawn(async move {
        let result = client
            .locks()
            .leader(key, TTL)
            .run(move |term| {
                let (store, log) = (store.clone(), log.clone());
                async move {
                    let fence = term.lease().fencing_token();
                    log.lock()
                        .unwrap()
                        .push((name.to_owned(), fence, Instant::now()));
                    println!("{name}: elected leader with fencing token {fence}");
                    for tick in 1.. {
                        if let Err(refusal) = store.schedule(fence, &format!("tick {tick}")) {
                            println!("{name}: {refusal}");
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Ok::<(), Error>(())
                }
            })
            .await;
        if let Err(err) = result {
            eprintln!("{name}: {err}");
        }
    });
    runtime
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (server, key) = if configured() {
        (None, "volcano-example-scheduler")
    } else {
        let server = MockServer::start().await;
        println!("(in-process mock lock server at {})", server.url());
        (Some(server), "scheduler")
    };
    let client = || match &server {
        Some(server) => Ok(Client::for_mock(server)),
        None => Client::from_env(),
    };

    let store = Arc::new(JobStore::default());
    let log: Log = Arc::default();
    let names = ["replica-a", "replica-b", "replica-c"];
    let mut runtimes = Vec::new();
    for name in names {
        runtimes.push(Some(replica(
            name,
            client()?,
            key,
            store.clone(),
            log.clone(),
        )));
    }

    // Let the first leader work for a few seconds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (leader, fence, _) = log.lock().unwrap().last().cloned().expect("a leader");
    let index = names.iter().position(|n| *n == leader).expect("a replica");
    println!("\n{leader} crashes (no release; its lease runs out in at most {TTL:?})");
    let crashed_at = Instant::now();
    if let Some(runtime) = runtimes[index].take() {
        runtime.shutdown_background();
    }

    // Wait for the next election.
    let next = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let entry = log.lock().unwrap().last().cloned();
        if let Some((name, new_fence, at)) = entry {
            if new_fence > fence {
                break (name, new_fence, at);
            }
        }
        if crashed_at.elapsed() > TTL + Duration::from_secs(10) {
            return Err("no new leader was elected".into());
        }
    };
    println!(
        "{} took over {:.1} s after the crash, with fencing token {} > {fence}",
        next.0,
        next.2.duration_since(crashed_at).as_secs_f64(),
        next.1
    );

    // A late write from the dead leader would now be refused.
    if let Err(refusal) = store.schedule(fence, "a late write from the dead leader") {
        println!("the store {refusal}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for runtime in runtimes.into_iter().flatten() {
        runtime.shutdown_background();
    }
    Ok(())
}

/// Whether the environment names a lock service: `VOLCANO_API_URL` or
/// `VOLCANO_SERVICE_KEY` set. Only when neither is does this example run on
/// an in-process mock server. (In your app, keep the SDK's `mock` feature
/// under `[dev-dependencies]`: a mock is for tests.)
fn configured() -> bool {
    [volcano::ENV_API_URL, volcano::ENV_SERVICE_KEY]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
