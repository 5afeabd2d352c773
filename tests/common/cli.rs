//! The `volcano` binary against the mock server, for the CLI's tests
//! (`#[path = "common/cli.rs"] mod cli;`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};
use volcano_mock_server::MockServer;

/// The CLI with the mock server's URL and keys, the given extra
/// environment, `args`, standard input closed, and out of any terminal's
/// foreground (a group of its own), as under cron or a supervisor, even
/// when the tests run in a terminal.
pub(crate) fn volcano(server: &MockServer, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_volcano"));
    command
        .process_group(0)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("VOLCANO_API_URL", server.url())
        .env("VOLCANO_SERVICE_KEY", server.service_key())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The members of `locks run`'s summary, in order (serde_json sorts them).
pub(crate) const SUMMARY_MEMBERS: [&str; 10] = [
    "at_risk",
    "exit_code",
    "fencing_token",
    "held_secs",
    "key",
    "lost",
    "lost_reason",
    "min_hold_kept",
    "signal",
    "started",
];

pub(crate) struct Ended {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ended {
    /// The summary object: the last line of standard output.
    pub(crate) fn summary(&self) -> Value {
        let line = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

pub(crate) async fn ended(child: Child) -> Ended {
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the CLI ends")
        .unwrap();
    Ended {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Sends SIGTERM to the CLI process.
pub(crate) fn sigterm(child: &Child) {
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

pub(crate) fn live(server: &MockServer, key: &str) -> bool {
    server.locks().iter().any(|l| l.key == key && l.live)
}

/// A scratch directory for the child's marker files.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("volcano-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A pipe whose reading end is already closed (`... | true`).
pub(crate) fn closed_pipe() -> Stdio {
    let (sender, receiver) = tokio::net::unix::pipe::pipe().unwrap();
    drop(receiver);
    Stdio::from(sender.into_blocking_fd().unwrap())
}
