//! The processes of a run: the worker slots, each running one worker or
//! `volcano locks run` at a time; what each said and how it ended; the
//! signals that pause, kill and stop them; the standalone mock server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{kill_process, Pid, Signal};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::now_ms;

/// The worker slots: a mode, its keys; each slot runs one process at a
/// time and starts another when it ends.
pub(crate) const SLOTS: [(&str, &str); 9] = [
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

/// The processes of a run, by name: what each said, how it ended, and
/// the live ones' pids.
#[derive(Default)]
pub(crate) struct Processes {
    pub(crate) said: BTreeMap<String, Vec<Value>>,
    pub(crate) exits: BTreeMap<String, Option<i32>>,
    pub(crate) live: BTreeMap<String, u32>,
    pub(crate) killed: BTreeMap<String, i64>,
    pub(crate) keys_of: BTreeMap<String, Vec<String>>,
    pub(crate) stopping: bool,
    pub(crate) started: usize,
}

pub(crate) type Shared = Arc<Mutex<Processes>>;

pub(crate) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Processes> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What every process of a run is given.
pub(crate) struct Setting {
    pub(crate) bin: PathBuf,
    pub(crate) api: String,
    pub(crate) db_urls: Vec<String>,
    pub(crate) fenced: bool,
    pub(crate) ttl: u64,
    pub(crate) seed: u64,
}

pub(crate) fn worker_command(
    s: &Setting,
    slot: usize,
    n: u64,
    mode: &str,
    keys: &str,
    name: &str,
) -> Command {
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
pub(crate) const SERVICE_KEY: &str = "e2e-service-key";

/// Runs slot `slot` until the run stops: one process at a time.
pub(crate) async fn slot(s: Arc<Setting>, shared: Shared, slot: usize) {
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

pub(crate) async fn read_lines(child: &mut Child, shared: &Shared, name: &str) {
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
pub(crate) fn family(pid: u32) -> Vec<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    std::iter::once(pid)
        .chain(children.split_whitespace().filter_map(|c| c.parse().ok()))
        .collect()
}

pub(crate) fn signal_family(pid: u32, sig: Signal) {
    for (i, member) in family(pid).into_iter().enumerate() {
        if i == 0 {
            signal(member, sig);
        } else if let Some(group) = i32::try_from(member).ok().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process_group(group, sig);
        }
    }
}

pub(crate) fn signal(pid: u32, sig: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let sent = kill_process(pid, sig);
        if std::env::var_os("E2E_TRACE").is_some() {
            eprintln!("{} signal {sig:?} to {pid:?}: {sent:?}", now_ms());
        }
    }
}

/// The standalone mock server, its quota on; returns its address.
pub(crate) async fn start_mock(bin: &Path) -> Result<(Child, SocketAddr), String> {
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
