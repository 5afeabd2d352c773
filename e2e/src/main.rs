//! `volcano-e2e`: the lock client and its fencing store where a user's
//! system runs them. Real processes (library workers and `volcano locks
//! run` commands) take locks from the standalone mock server (its quota
//! on) through a fault proxy, and increment counters in PostgreSQL under
//! two roles with their own schemas; a seeded schedule pauses holders past
//! their ttl (SIGSTOP, then SIGCONT), kills them (SIGKILL), stops them
//! (SIGTERM), partitions them, holds answers the service applied, and
//! storms the service with 503s and 429s. Then it checks what PostgreSQL
//! committed against what the service granted and what each process
//! said (`checks.rs`).
//!
//! The same schedule runs twice: through the fence, and with the fence
//! check off (the control, which must lose updates, or the faults did not
//! bite).
//!
//! ```text
//! cargo build --workspace --all-features --bins
//! target/debug/volcano-e2e --secs 60 [--seed N] [--only fenced|control]
//! ```

mod checks;
mod db;
mod proxy;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustix::process::{kill_process, Pid, Signal};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use checks::{Evidence, Grant, Verdict};
use proxy::{Mode, Proxy};

/// The keys the workers share.
const KEYS: [&str; 3] = ["e2e-a", "e2e-b", "e2e-c"];

/// The worker slots: a mode, its keys; each slot runs one process at a
/// time and starts another when it ends.
const SLOTS: [(&str, &str); 9] = [
    ("with_lock", "e2e-a"),
    ("with_lock", "e2e-a"),
    ("hold", "e2e-b"),
    ("hold", "e2e-b"),
    ("leader", "e2e-c"),
    ("leader", "e2e-c"),
    ("hold_all", "e2e-b,e2e-c"),
    ("cli", "e2e-a"),
    ("cli", "e2e-c"),
];

/// A journal time (RFC 3339), in milliseconds since the epoch.
fn epoch_ms(at: &Value) -> Option<i64> {
    let at = chrono::DateTime::parse_from_rfc3339(at.as_str()?).ok()?;
    Some(at.timestamp_millis())
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

struct Args {
    seed: u64,
    secs: u64,
    ttl: u64,
    runs: Vec<bool>,
    bin: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut seed = None;
    let mut secs = 60;
    let mut ttl = 5;
    // The control first: it runs until it has lost an update, and the
    // fenced run then runs as long, with the same schedule.
    let mut runs = vec![false, true];
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--seed" => seed = Some(value()?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--secs" => secs = value()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--ttl" => ttl = value()?.parse().map_err(|e| format!("--ttl: {e}"))?,
            "--only" => {
                runs = match value()?.as_str() {
                    "fenced" => vec![true],
                    "control" => vec![false],
                    other => return Err(format!("--only fenced|control, not {other:?}")),
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = exe.parent().ok_or("no binary folder")?.to_path_buf();
    for needed in ["volcano", "volcano-mock-server", "e2e-worker"] {
        if !bin.join(needed).exists() {
            return Err(format!(
                "{} is missing: cargo build --workspace --all-features --bins",
                bin.join(needed).display()
            ));
        }
    }
    Ok(Args {
        seed: seed.unwrap_or_else(rand::random),
        secs,
        ttl,
        runs,
        bin,
    })
}

/// The processes of a run, by name: what each said, how it ended, and
/// the live ones' pids.
#[derive(Default)]
struct Processes {
    said: BTreeMap<String, Vec<Value>>,
    exits: BTreeMap<String, Option<i32>>,
    live: BTreeMap<String, u32>,
    killed: BTreeMap<String, i64>,
    keys_of: BTreeMap<String, Vec<String>>,
    stopping: bool,
    started: usize,
}

type Shared = Arc<Mutex<Processes>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Processes> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What every process of a run is given.
struct Setting {
    bin: PathBuf,
    api: String,
    db_urls: Vec<String>,
    fenced: bool,
    ttl: u64,
    seed: u64,
}

fn worker_command(s: &Setting, slot: usize, n: u64, mode: &str, keys: &str, name: &str) -> Command {
    let mut cmd = if mode == "cli" {
        let mut cmd = Command::new(s.bin.join("volcano"));
        cmd.args(["locks", "run", keys, "--ttl"])
            .arg(format!("{}s", s.ttl))
            .args([
                "--wait",
                "20s",
                "--kill-after",
                "2s",
                "--output",
                "json",
                "--",
            ])
            .arg(s.bin.join("e2e-worker"))
            .env("E2E_MODE", "write");
        cmd
    } else {
        let mut cmd = Command::new(s.bin.join("e2e-worker"));
        cmd.env("E2E_MODE", mode);
        cmd
    };
    cmd.env("E2E_WORKER", name)
        .env("E2E_KEYS", keys)
        .env("E2E_TTL", s.ttl.to_string())
        .env("E2E_DB", &s.db_urls[slot % s.db_urls.len()])
        .env("E2E_FENCE", if s.fenced { "1" } else { "0" })
        .env("E2E_SEED", (s.seed ^ ((slot as u64) << 48) ^ n).to_string())
        .env("VOLCANO_API_URL", &s.api)
        .env("VOLCANO_SERVICE_KEY", SERVICE_KEY)
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("E2E_STDERR").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true);
    cmd
}

/// The service key the run's mock server accepts.
const SERVICE_KEY: &str = "e2e-service-key";

/// Runs slot `slot` until the run stops: one process at a time.
async fn slot(s: Arc<Setting>, shared: Shared, slot: usize) {
    let (mode, keys) = SLOTS[slot];
    let mut n = 0;
    loop {
        n += 1;
        let name = format!("{mode}{slot}-{n}");
        // Spawned and registered under the lock, so that the end's SIGTERM
        // reaches every process started.
        let mut child = {
            let mut p = lock(&shared);
            if p.stopping {
                return;
            }
            let Ok(child) = worker_command(&s, slot, n, mode, keys, &name).spawn() else {
                return;
            };
            p.live.insert(name.clone(), child.id().unwrap_or(0));
            p.keys_of
                .insert(name.clone(), keys.split(',').map(str::to_owned).collect());
            p.started += 1;
            child
        };
        read_lines(&mut child, &shared, &name).await;
        let status = child.wait().await.ok().and_then(|s| s.code());
        {
            let mut p = lock(&shared);
            p.live.remove(&name);
            p.exits.insert(name, status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn read_lines(child: &mut Child, shared: &Shared, name: &str) {
    let Some(out) = child.stdout.take() else {
        return;
    };
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Ok(value) = serde_json::from_str::<Value>(&line) {
            lock(shared)
                .said
                .entry(name.to_owned())
                .or_default()
                .push(value);
        }
    }
}

/// `pid` and, for a `volcano locks run`, its command's process group: a
/// pause or a kill of the host reaches both.
fn family(pid: u32) -> Vec<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    std::iter::once(pid)
        .chain(children.split_whitespace().filter_map(|c| c.parse().ok()))
        .collect()
}

fn signal_family(pid: u32, sig: Signal) {
    for (i, member) in family(pid).into_iter().enumerate() {
        if i == 0 {
            signal(member, sig);
        } else if let Some(group) = i32::try_from(member).ok().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process_group(group, sig);
        }
    }
}

fn signal(pid: u32, sig: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let sent = kill_process(pid, sig);
        if std::env::var_os("E2E_TRACE").is_some() {
            eprintln!("{} signal {sig:?} to {pid:?}: {sent:?}", now_ms());
        }
    }
}

/// The standalone mock server, its quota on; returns its address.
async fn start_mock(bin: &Path) -> Result<(Child, SocketAddr), String> {
    let mut child = Command::new(bin.join("volcano-mock-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--rate-limit",
            "600",
            "--service-key",
            SERVICE_KEY,
        ])
        .env("RUST_LOG", "off")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting the mock server: {e}"))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(url) = line.strip_prefix("volcano mock lock server listening on http://") {
            let addr = url
                .trim_end_matches('/')
                .parse()
                .map_err(|e| format!("{url}: {e}"))?;
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok((child, addr));
        }
    }
    Err("the mock server said nothing".into())
}

/// Counts of what the schedule did.
#[derive(Debug, Default)]
struct Faults {
    secs: f64,
    by_kind: BTreeMap<&'static str, usize>,
    long_pauses: usize,
    on: Vec<(i64, i64)>,
    pauses: Vec<(i64, i64)>,
}

/// The seeded schedule: a fault every 0.5 to 1.5 s until `secs` have
/// passed. The kinds and their parameters come from the seed; which
/// process a signal reaches depends on which are running then.
async fn schedule(
    seed: u64,
    until: &Until<'_>,
    ttl: u64,
    proxy: &Proxy,
    mock: &str,
    shared: &Shared,
) -> Faults {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut faults = Faults::default();
    let began = tokio::time::Instant::now();
    let mut paused: Vec<(Vec<u32>, tokio::time::Instant)> = Vec::new();
    let mut checked = began;
    loop {
        let ran = began.elapsed();
        if ran >= until.longest() {
            break;
        }
        if let Until::Lost { min, db, .. } = until {
            // The control goes on until it has lost an update (or its
            // longest time): the faults must be seen to bite.
            if ran >= *min && checked.elapsed() >= Duration::from_secs(3) {
                checked = tokio::time::Instant::now();
                if db::lost_so_far(db.0, db.1).await.unwrap_or(0) > 0 {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
        let now = tokio::time::Instant::now();
        paused.retain(|(pids, until)| {
            let over = *until <= now;
            if over {
                for pid in pids {
                    signal(*pid, Signal::CONT);
                }
            }
            !over
        });
        let roll = rng.random_range(0..100);
        let pick = rng.random_range(0..1000usize);
        let target = {
            let p = lock(shared);
            // Not one that is paused already.
            let live: Vec<(String, u32)> = p
                .live
                .iter()
                .filter(|(_, pid)| !paused.iter().any(|(p, _)| p.contains(*pid)))
                .map(|(n, pid)| (n.clone(), *pid))
                .collect();
            // Signals go to a holder when there is one, at the worst
            // moment: a library worker that has just read a counter it is
            // about to write back (its last word `read`) or holds a lock
            // (`held`); one time in four, a `locks run` (holding or
            // waiting: it does not say) may be picked too.
            let with_cli = pick % 4 == 0;
            let last = |name: &String| {
                p.said
                    .get(name)
                    .and_then(|l| l.last())
                    .map(|l| l["event"].clone())
            };
            let holding: Vec<(String, u32)> = live
                .iter()
                .filter(|(name, _)| {
                    (with_cli && name.starts_with("cli"))
                        || last(name).is_some_and(|e| e == "read" || e == "held")
                })
                .cloned()
                .collect();
            let among = if holding.is_empty() { &live } else { &holding };
            (!among.is_empty()).then(|| among[pick % among.len()].clone())
        };
        let lasting = Duration::from_millis(rng.random_range(500..2500));
        let start = now_ms();
        let kind = match (roll, &target) {
            (0..50, Some((name, pid))) => {
                if std::env::var_os("E2E_TRACE").is_some() {
                    eprintln!("{} pausing {name}", now_ms());
                }
                let pause =
                    Duration::from_millis(rng.random_range(ttl * 1200 + 1000..ttl * 2000 + 2000));
                // A host pause: a `locks run` stops with its command.
                let pids = family(*pid);
                for member in &pids {
                    signal(*member, Signal::STOP);
                }
                paused.push((pids, now + pause));
                faults.long_pauses += 1;
                faults
                    .pauses
                    .push((start, start + pause.as_millis() as i64));
                "pause past the ttl (SIGSTOP, SIGCONT)"
            }
            (50..58, Some((name, pid))) => {
                lock(shared).killed.insert(name.clone(), start);
                signal_family(*pid, Signal::KILL);
                "kill (SIGKILL)"
            }
            (58..64, Some((_, pid))) => {
                signal(*pid, Signal::TERM);
                "stop (SIGTERM)"
            }
            (64..70, _) => {
                network(proxy, Mode::Partition, lasting, &mut faults.on).await;
                "partition"
            }
            (70..78, _) => {
                let held = Duration::from_millis(rng.random_range(200..1500));
                network(proxy, Mode::Hold(held), lasting, &mut faults.on).await;
                "answers held after the service applied, then cut"
            }
            (78..84, _) => {
                let delay = Duration::from_millis(rng.random_range(50..400));
                network(proxy, Mode::Delay(delay), lasting, &mut faults.on).await;
                "delays"
            }
            (84..89, _) => {
                network(proxy, Mode::Reset, lasting, &mut faults.on).await;
                "resets after the request"
            }
            (89..95, _) => {
                storm(&http, mock, 503, lasting, &mut faults.on).await;
                "503 storm"
            }
            _ => {
                storm(&http, mock, 429, lasting, &mut faults.on).await;
                "429 storm"
            }
        };
        *faults.by_kind.entry(kind).or_default() += 1;
    }
    for (pids, _) in paused {
        for pid in pids {
            signal(pid, Signal::CONT);
        }
    }
    faults.secs = began.elapsed().as_secs_f64();
    faults
}

/// How long the schedule runs.
enum Until<'a> {
    /// This long.
    Secs(Duration),
    /// At least `min`, then until the run's database (URL, name) has lost
    /// an update, at most `max`.
    Lost {
        min: Duration,
        max: Duration,
        db: (&'a str, &'a str),
    },
}

impl Until<'_> {
    fn longest(&self) -> Duration {
        match self {
            Until::Secs(d) => *d,
            Until::Lost { max, .. } => *max,
        }
    }
}

async fn network(proxy: &Proxy, mode: Mode, lasting: Duration, on: &mut Vec<(i64, i64)>) {
    let start = now_ms();
    proxy.set(mode);
    tokio::time::sleep(lasting).await;
    proxy.set(Mode::Pass);
    on.push((start, now_ms()));
}

async fn storm(
    http: &reqwest::Client,
    mock: &str,
    status: u16,
    lasting: Duration,
    on: &mut Vec<(i64, i64)>,
) {
    let start = now_ms();
    let fault = serde_json::json!({"kind": "status", "status": status});
    let _ = http
        .post(format!("{mock}/__mock/faults"))
        .json(&fault)
        .send()
        .await;
    tokio::time::sleep(lasting).await;
    let _ = http.delete(format!("{mock}/__mock/faults")).send().await;
    on.push((start, now_ms()));
}

/// One run: everything started afresh, the schedule, the end, the checks.
async fn run(
    a: &Args,
    pg_url: &str,
    fenced: bool,
    secs: Option<f64>,
) -> Result<(Verdict, Faults, usize), String> {
    let name = if fenced { "e2e_fenced" } else { "e2e_control" };
    let db_urls = db::prepare(pg_url, name, &KEYS).await?;
    let (mut mock, mock_addr) = tokio::time::timeout(Duration::from_secs(30), start_mock(&a.bin))
        .await
        .map_err(|_| "the mock server did not start within 30 s".to_owned())??;
    let mock_url = format!("http://{mock_addr}");
    let proxy = Proxy::start(mock_addr)
        .await
        .map_err(|e| format!("starting the proxy: {e}"))?;
    let setting = Arc::new(Setting {
        bin: a.bin.clone(),
        api: format!("http://{}", proxy.addr),
        db_urls,
        fenced,
        ttl: a.ttl,
        seed: a.seed,
    });
    let shared: Shared = Arc::default();
    let slots: Vec<_> = (0..SLOTS.len())
        .map(|i| tokio::spawn(slot(setting.clone(), shared.clone(), i)))
        .collect();
    let until = match secs {
        Some(secs) => Until::Secs(Duration::from_secs_f64(secs)),
        None => Until::Lost {
            min: Duration::from_secs(a.secs),
            max: Duration::from_secs(a.secs * 4),
            db: (pg_url, name),
        },
    };
    let faults = schedule(a.seed, &until, a.ttl, &proxy, &mock_url, &shared).await;

    // The end: the network healed, the service's faults cleared, every
    // process resumed and asked to stop; the leases checked at once.
    proxy.set(Mode::Pass);
    let http = reqwest::Client::new();
    let _ = http
        .delete(format!("{mock_url}/__mock/faults"))
        .send()
        .await;
    let live: Vec<u32> = {
        let mut p = lock(&shared);
        p.stopping = true;
        p.live.values().copied().collect()
    };
    for pid in &live {
        for member in family(*pid) {
            signal(member, Signal::CONT);
        }
        signal(*pid, Signal::TERM);
    }
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        for s in slots {
            let _ = s.await;
        }
    })
    .await;
    if ended.is_err() {
        let left: Vec<String> = lock(&shared).live.keys().cloned().collect();
        for pid in lock(&shared).live.values() {
            signal_family(*pid, Signal::KILL);
        }
        return Err(format!(
            "processes did not end within 20 s of SIGTERM: {}",
            left.join(", ")
        ));
    }
    let locks: Vec<Value> = get_json(&http, &format!("{mock_url}/__mock/locks")).await?;
    let journal: Vec<Value> = get_json(&http, &format!("{mock_url}/__mock/requests")).await?;
    let _ = mock.kill().await;

    let grants: Vec<Grant> = journal
        .iter()
        .filter(|r| r["operation"] == "acquire" && r["status"] == 201)
        .filter_map(|r| {
            Some(Grant {
                key: r["key"].as_str()?.to_owned(),
                fence: r["fencing_token"].as_i64()?,
                at_ms: epoch_ms(&r["at"])?,
            })
        })
        .collect();
    let truncated = journal.first().is_some_and(|r| r["seq"] != 1);
    // The service's own 429s (its quota, not an injected storm) slow
    // waiters down as a fault does.
    let mut faults_on = faults.on.clone();
    faults_on.extend(faults.pauses.iter().copied());
    for r in &journal {
        if r["status"] == 429 {
            if let Some(at) = epoch_ms(&r["at"]) {
                faults_on.push((at - 1_000, at + 60_000));
            }
        }
    }
    let mut expiries: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for r in &journal {
        let granted = (r["operation"] == "acquire" && r["status"] == 201)
            || (r["operation"] == "renew" && r["status"] == 200);
        let (Some(key), Some(fence), Some(at)) = (
            r["key"].as_str(),
            r["fencing_token"].as_i64(),
            epoch_ms(&r["expires_at"]),
        ) else {
            continue;
        };
        if granted {
            let until = expiries.entry((key.to_owned(), fence)).or_default();
            *until = (*until).max(at);
        }
    }
    let live_at_end = locks
        .iter()
        .filter(|l| l["live"] == true)
        .filter_map(|l| Some((l["key"].as_str()?.to_owned(), l["fencing_token"].as_i64()?)))
        .collect();
    let p = std::mem::take(&mut *lock(&shared));
    let outcome = db::outcome(pg_url, name).await?;
    if std::env::var_os("E2E_TRACE").is_some() {
        for w in &outcome.history {
            eprintln!(
                "{} commit {} {} fence {} by {}",
                w.sent_at_ms, w.key, w.value, w.fence, w.worker
            );
        }
        for g in &grants {
            eprintln!("{} grant {} fence {}", g.at_ms, g.key, g.fence);
        }
    }
    let evidence = Evidence {
        fenced,
        db: outcome,
        grants,
        expiries,
        live_at_end,
        said: p.said,
        exits: p.exits,
        killed: p.killed,
        keys_of: p.keys_of,
        faults_on,
        truncated,
    };
    Ok((checks::judge(&evidence), faults, p.started))
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<Vec<Value>, String> {
    http.get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("{url}: {e}"))
}

fn print(fenced: bool, v: &Verdict, faults: &Faults, processes: usize) {
    let what = if fenced {
        "through the fence"
    } else {
        "control, fence off"
    };
    println!("{what}: {:.0} s", faults.secs);
    println!("  processes started: {processes}");
    let kinds: Vec<String> = faults
        .by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!("  faults: {}", kinds.join(", "));
    println!("  pauses longer than the ttl: {}", faults.long_pauses);
    println!(
        "  increments committed: {}; holds reported successful: {}; writes refused by the fence: {}",
        v.commits, v.successes, v.refusals
    );
    let hands: Vec<String> = v
        .holders_per_key
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!("  grants per key: {}", hands.join(", "));
    println!(
        "  lost updates: {}; stale commits: {}; untruthful reports: {}; unexplained refusals: {}; leaks: {}",
        v.lost_updates, v.stale_commits, v.untruthful, v.unexplained_refusals, v.leaks
    );
    println!(
        "  takeovers after a kill judged: {}, slowest {} ms, too slow {}",
        v.takeovers_judged, v.slowest_takeover_ms, v.slow_takeovers
    );
    for violation in &v.violations {
        println!("  VIOLATION: {violation}");
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(err) => {
            eprintln!("volcano-e2e: {err}");
            return ExitCode::from(2);
        }
    };
    println!(
        "volcano-e2e: seed {}, {} s per run, ttl {} s",
        a.seed, a.secs, a.ttl
    );
    let pg = match volcano_fence::testing::Postgres::shared() {
        Ok(pg) => pg,
        Err(err) => {
            eprintln!("volcano-e2e: no PostgreSQL: {err}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    let mut secs = None;
    for fenced in a.runs.clone() {
        let only = a.runs.len() == 1;
        let this = if fenced || only {
            Some(secs.unwrap_or(a.secs as f64))
        } else {
            None
        };
        match run(&a, pg.url(), fenced, this).await {
            Ok((verdict, faults, processes)) => {
                secs = Some(faults.secs);
                print(fenced, &verdict, &faults, processes);
                let control_bit = fenced || a.runs.len() == 1 || verdict.lost_updates > 0;
                if !control_bit {
                    println!(
                        "  FAILED: the control lost no update: the faults did not bite, and the \
                         fenced run proved nothing"
                    );
                }
                failed |= !verdict.violations.is_empty() || !control_bit;
            }
            Err(err) => {
                println!("run failed: {err}");
                failed = true;
            }
        }
    }
    if failed {
        println!(
            "FAILED. Replay the schedule: target/debug/volcano-e2e --seed {} --secs {} --ttl {}",
            a.seed, a.secs, a.ttl
        );
        return ExitCode::FAILURE;
    }
    println!("passed");
    ExitCode::SUCCESS
}
