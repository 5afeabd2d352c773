//! One worker process of the end-to-end run (`volcano-e2e`): it takes a
//! lock the way an application would (`with_lock`, `hold`, `leader`,
//! `hold_all`, or as the command of `volcano locks run`: mode `write`) and,
//! holding it, increments counters in PostgreSQL by read-modify-write,
//! through `volcano-fence`'s check unless `E2E_FENCE=0`.
//!
//! It says what it did as JSON lines on standard output, for the harness
//! to check against the service's journal and PostgreSQL's history:
//! `held` (a lease it got), `read` (it read a counter and is about to
//! write it back), `done` (what a hold returned: `ok` is what the SDK
//! reported), `refused` (a write the fence refused), `shutdown` (what
//! `Client::shutdown` said may still be held). SIGTERM stops it
//! gracefully.
//!
//! Environment: `E2E_MODE`, `E2E_WORKER` (its name in the history),
//! `E2E_KEYS` (comma-separated; two for `hold_all`), `E2E_TTL` (seconds),
//! `E2E_DB` (a PostgreSQL URL, with the role to write as), `E2E_FENCE`,
//! `E2E_SEED`; and the SDK's `VOLCANO_API_URL` and `VOLCANO_SERVICE_KEY`.
//! In mode `write`, the key and fence come from `volcano locks run`
//! (`VOLCANO_LOCK_KEY`, `VOLCANO_FENCING_TOKEN`).

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::{watch, Mutex};
use volcano::{Client, LockGuard};

/// How long a worker waits for a lock before it tries again.
const WAIT: Duration = Duration::from_secs(20);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("e2e-worker needs {name}"))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One line of the worker's report; a closed pipe is not an error here.
fn emit(mut event: Value) {
    event["at_ms"] = json!(now_ms());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{event}");
    let _ = out.flush();
}

/// Why an increment did not commit.
#[derive(Debug)]
enum Failed {
    /// The fence refused it: a higher fence was seen.
    Stale,
    /// A lock or serialization timeout, or a lost connection: try later.
    Database(String),
    /// The lock, from the SDK.
    Lock(volcano::Error),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Stale => f.write_str("the fence refused a write"),
            Failed::Database(why) => write!(f, "database: {why}"),
            Failed::Lock(err) => write!(f, "lock: {err}"),
        }
    }
}

impl From<volcano::Error> for Failed {
    fn from(err: volcano::Error) -> Self {
        Failed::Lock(err)
    }
}

/// The counters in PostgreSQL, reached as one role.
struct Store {
    url: String,
    db: Option<tokio_postgres::Client>,
    fenced: bool,
    worker: String,
    rng: StdRng,
}

impl Store {
    async fn connected(&mut self) -> Result<&mut tokio_postgres::Client, Failed> {
        if self.db.as_ref().is_none_or(|db| db.is_closed()) {
            let (db, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
                .await
                .map_err(|e| Failed::Database(e.to_string()))?;
            tokio::spawn(connection);
            // As a service does at every start: idempotent, and no DDL once
            // the table is there.
            if let Err(err) = volcano_fence::tokio_postgres::migrate(&db).await {
                eprintln!("e2e-worker {}: migrate: {err}", self.worker);
                return Err(Failed::Database(err.to_string()));
            }
            self.db = Some(db);
        }
        Ok(self.db.as_mut().expect("connected above"))
    }

    /// Reads the key's counter and writes it back plus one, in one
    /// transaction; the fence check first when fenced. A pause between
    /// the steps is where a stale holder does its damage.
    async fn increment(&mut self, key: &str, fence: i64) -> Result<(), Failed> {
        // Most of a hold is spent between the read and the write: a pause
        // there is a pause of a holder about to write what it read.
        let outside = Duration::from_millis(self.rng.random_range(5..30));
        let inside = Duration::from_millis(self.rng.random_range(150..500));
        let (fenced, worker) = (self.fenced, self.worker.clone());
        tokio::time::sleep(outside).await;
        let db = self.connected().await?;
        let failed = |e: tokio_postgres::Error| Failed::Database(e.to_string());
        let tx = db.transaction().await.map_err(failed)?;
        if fenced {
            if let Err(err) = volcano_fence::tokio_postgres::check(&tx, key, fence).await {
                if err.is_stale() {
                    emit(json!({"event": "refused", "worker": worker, "key": key,
                        "fence": fence, "highest": err.highest_seen()}));
                    return Err(Failed::Stale);
                }
                return Err(Failed::Database(err.to_string()));
            }
        }
        let n: i64 = tx
            .query_one("SELECT n FROM public.counters WHERE key = $1", &[&key])
            .await
            .map_err(failed)?
            .get(0);
        // Said, so that the harness can pause a holder right here.
        emit(json!({"event": "read", "worker": worker, "key": key, "fence": fence}));
        tokio::time::sleep(inside).await;
        let sent_at = now_ms();
        tx.execute(
            "UPDATE public.counters SET n = $2 WHERE key = $1",
            &[&key, &(n + 1)],
        )
        .await
        .map_err(failed)?;
        tx.execute(
            "INSERT INTO public.history (key, value, fence, worker, sent_at_ms) \
             VALUES ($1, $2, $3, $4, $5)",
            &[&key, &(n + 1), &fence, &worker, &sent_at],
        )
        .await
        .map_err(failed)?;
        tx.commit().await.map_err(failed)
    }

    /// A few increments of `keys` (in turn) under their fences; the first
    /// failure ends them.
    async fn work(
        &mut self,
        keys: &[(String, i64)],
        times: std::ops::Range<usize>,
    ) -> Result<(), Failed> {
        let times = self.rng.random_range(times);
        for i in 0..times {
            let (key, fence) = &keys[i % keys.len()];
            self.increment(key, *fence).await?;
        }
        Ok(())
    }
}

fn held(worker: &str, key: &str, fence: i64) {
    emit(json!({"event": "held", "worker": worker, "key": key, "fence": fence}));
}

fn done(worker: &str, keys: &[(String, i64)], ok: bool, why: Option<String>) {
    emit(json!({"event": "done", "worker": worker,
        "keys": keys.iter().map(|(k, f)| json!({"key": k, "fence": f})).collect::<Vec<_>>(),
        "ok": ok, "why": why}));
}

/// The fence a scoped hold (`with_lock`, a leader's term) got, once it got one.
type Seen = Arc<std::sync::Mutex<Option<i64>>>;

/// The work of a scoped hold: says `held`, then increments under its fence.
async fn scoped(
    guard: LockGuard,
    seen: Seen,
    store: Arc<Mutex<Store>>,
    worker: String,
) -> Result<(), Failed> {
    let fence = guard.lease().fencing_token();
    *seen.lock().unwrap() = Some(fence);
    held(&worker, guard.key(), fence);
    let keys = [(guard.key().to_owned(), fence)];
    store.lock().await.work(&keys, 2..6).await
}

/// Says `done` for a scoped hold that got its lock: `ok` is what it returned.
fn scope_done(worker: &str, key: String, seen: &Seen, result: Result<(), Failed>) {
    if let Some(fence) = *seen.lock().unwrap() {
        let why = result.as_ref().err().map(ToString::to_string);
        done(worker, &[(key, fence)], result.is_ok(), why);
    }
}

/// Says `done` for a hold released by hand: `ok` when the work and the
/// release both succeeded.
fn hold_done(
    worker: &str,
    keys: &[(String, i64)],
    worked: Result<(), Failed>,
    released: volcano::Result<()>,
) {
    let why = match (&worked, &released) {
        (Err(e), _) => Some(e.to_string()),
        (_, Err(e)) => Some(e.to_string()),
        _ => None,
    };
    done(worker, keys, worked.is_ok() && released.is_ok(), why);
}

/// One hold of the worker's lock(s), as its mode takes it.
async fn round(mode: &str, client: &Client, store: &Arc<Mutex<Store>>, keys: &[String]) {
    let locks = client.locks();
    let ttl = Duration::from_secs(env("E2E_TTL").parse().expect("E2E_TTL in seconds"));
    let worker = store.lock().await.worker.clone();
    let key = keys[0].clone();
    match mode {
        "with_lock" => {
            let seen = Arc::new(std::sync::Mutex::new(None));
            let (fence, inner, name) = (seen.clone(), store.clone(), worker.clone());
            let result = locks
                .with_lock(key.clone(), ttl, move |guard: LockGuard| {
                    scoped(guard, fence, inner, name)
                })
                .wait(WAIT)
                .await;
            scope_done(&worker, key, &seen, result);
        }
        "hold" => {
            let Ok(lock) = locks.hold(key.clone(), ttl).wait(WAIT).await else {
                return;
            };
            let fenced = [(key.clone(), lock.lease().fencing_token())];
            held(&worker, &key, fenced[0].1);
            let worked = store.lock().await.work(&fenced, 2..6).await;
            hold_done(&worker, &fenced, worked, lock.release().await);
        }
        "hold_all" => {
            let Ok(set) = locks.hold_all(keys.to_vec(), ttl).wait(WAIT).await else {
                return;
            };
            let fenced: Vec<(String, i64)> = keys
                .iter()
                .map(|k| (k.clone(), set.fencing_token(k).expect("a key of the set")))
                .collect();
            for (k, f) in &fenced {
                held(&worker, k, *f);
            }
            let worked = store.lock().await.work(&fenced, 2..6).await;
            hold_done(&worker, &fenced, worked, set.release().await);
        }
        "leader" => {
            // One term: a few increments, then step down (`run` returns).
            let seen = Arc::new(std::sync::Mutex::new(None));
            let (fence, inner, name) = (seen.clone(), store.clone(), worker.clone());
            let result = locks
                .leader(key.clone(), ttl)
                .run(move |guard: LockGuard| {
                    scoped(guard, fence.clone(), inner.clone(), name.clone())
                })
                .await;
            scope_done(&worker, key, &seen, result);
        }
        other => panic!("e2e-worker: unknown mode {other:?}"),
    }
}

/// Mode `write`: the command of `volcano locks run`. Exit 0 when every
/// increment committed, 4 when the fence refused one, 5 on a database
/// error.
async fn write(store: &mut Store) -> ExitCode {
    let key = env("VOLCANO_LOCK_KEY");
    let fence: i64 = env("VOLCANO_FENCING_TOKEN")
        .parse()
        .expect("a fencing token");
    // A command runs longer than a library hold: long enough for its
    // lease to run out while it writes when its CLI is paused.
    match store.work(&[(key, fence)], 8..20).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed::Stale) => ExitCode::from(4),
        Err(_) => ExitCode::from(5),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mode = env("E2E_MODE");
    let worker = env("E2E_WORKER");
    let seed: u64 = env("E2E_SEED").parse().expect("E2E_SEED");
    let mut store = Store {
        url: env("E2E_DB"),
        db: None,
        fenced: env("E2E_FENCE") != "0",
        worker: worker.clone(),
        rng: StdRng::seed_from_u64(seed),
    };
    if mode == "write" {
        return write(&mut store).await;
    }
    let keys: Vec<String> = env("E2E_KEYS").split(',').map(str::to_owned).collect();
    let client = match Client::from_env() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("e2e-worker {worker}: {err}");
            return ExitCode::from(2);
        }
    };
    let (stop_tx, mut stop) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        term.recv().await;
        let _ = stop_tx.send(true);
    });
    let store = Arc::new(Mutex::new(store));
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            _ = async {
                round(&mode, &client, &store, &keys).await;
                // A breath between holds (and after a failed one).
                tokio::time::sleep(Duration::from_millis(50)).await;
            } => {}
        }
    }
    // Graceful: what may still be held is named, and the lease released.
    let unreleased = client.shutdown(Duration::from_secs(5)).await;
    emit(json!({"event": "shutdown", "worker": worker, "unreleased": unreleased}));
    ExitCode::SUCCESS
}
