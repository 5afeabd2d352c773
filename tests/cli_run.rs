//! `volcano locks run KEY -- CMD`: the real binary, a real child process,
//! against the mock server.
#![cfg(all(feature = "cli", unix))]

use std::path::Path;
use std::process::Stdio;

use std::time::Duration;
use tokio::process::Command;

use serde_json::Value;
use volcano_mock_server::{MockServer, Operation};

#[path = "common/cli.rs"]
mod cli;
use cli::{closed_pipe, ended, live, scratch, sigterm, volcano, SUMMARY_MEMBERS};

/// Another operator force-releases `key` with the CLI.
async fn force_release(server: &MockServer, key: &str) {
    let admin = volcano(server, &["locks", "force-release", key, "--yes"])
        .output()
        .await
        .unwrap();
    assert_eq!(admin.status.code(), Some(0), "{admin:?}");
}

/// A shell script that records SIGTERM in `mark` and exits 0 on it, and
/// otherwise runs for up to a minute. Once its trap is set it writes
/// `mark.started`.
fn records_sigterm(mark: &Path) -> String {
    format!(
        "trap 'echo terminated > {0}; exit 0' TERM; echo started > {0}.started; \
         i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 9",
        mark.display()
    )
}

/// Waits (checking every 10 ms, at most 10 s) for the script to say it
/// started.
async fn started(mark: &Path) {
    let started = mark.with_extension("started");
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !started.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the command never started");
}

#[tokio::test]
async fn a_command_that_outlives_several_renewals_keeps_the_lock_and_gives_its_exit_code() {
    let server = MockServer::start().await;
    let child = volcano(
        &server,
        &[
            "--output", "json", "locks", "run", "report", "--ttl", "5", "--",
            "/bin/sh", "-c",
            "sleep 4; echo \"key=$VOLCANO_LOCK_KEY fence=$VOLCANO_FENCING_TOKEN service_key=${VOLCANO_SERVICE_KEY:-unset}\"; exit 42",
        ],
    )
    .spawn()
    .unwrap();
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(42), "{}", ended.stderr);
    assert!(
        ended
            .stdout
            .contains("key=report fence=1 service_key=unset"),
        "{}",
        ended.stdout
    );
    let summary = ended.summary();
    assert_eq!(summary["exit_code"], 42);
    assert_eq!(summary["lost"], false);
    assert_eq!(summary["fencing_token"], 1);
    assert!(summary["held_secs"].as_f64().unwrap() >= 4.0);
    let renewed = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Renew && r.status == Some(200))
        .count();
    assert!(renewed >= 2, "renewed {renewed} times in 4 s at ttl 5");
    assert!(!live(&server, "report"), "released when the command exited");
}

/// Renewals answered 503 twice, then accepted: the command goes on, the
/// episode is said once on standard error (the SDK's WARN line, JSON with
/// `--output json`) and counted in the summary.
#[tokio::test]
async fn renewals_failing_for_a_while_are_said_once_and_counted() {
    use volcano_mock_server::Fault;
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew).times(2));
    let child = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "run",
            "report",
            "--ttl",
            "5",
            "--",
            "/bin/sh",
            "-c",
            "sleep 5; exit 0",
        ],
    )
    .spawn()
    .unwrap();
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(0), "{}", ended.stderr);
    let summary = ended.summary();
    assert_eq!(summary["lost"], false, "{summary}");
    assert_eq!(summary["at_risk"], 1, "{summary}");
    assert_eq!(
        ended.stderr.matches("lock at risk:").count(),
        1,
        "{}",
        ended.stderr
    );
    assert!(ended.stderr.contains("HTTP 503"), "{}", ended.stderr);
}

/// `--min-hold`: a command that ends at once exits at once, and the
/// service keeps the key until the minimum's end with the CLI gone (one
/// renewal, no release); another host's run meanwhile skips (exit 3). A
/// minimum past 90 days or past `--max-hold` is refused before anything
/// is sent (exit 2), by the SDK's own rule.
#[tokio::test]
async fn a_command_that_ends_early_exits_and_the_service_keeps_the_key() {
    let server = MockServer::start().await;
    let began = server.now();
    let run = |server: &MockServer| {
        volcano(
            server,
            &[
                "--output",
                "json",
                "locks",
                "run",
                "report",
                "--ttl",
                "5",
                "--min-hold",
                "60s",
                "--",
                "true",
            ],
        )
        .spawn()
        .unwrap()
    };
    let first = tokio::time::timeout(Duration::from_secs(10), ended(run(&server)))
        .await
        .expect("exits once the command has ended, not after the minimum");
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert_eq!(first.summary()["lost"], false);
    let members: Vec<String> = first
        .summary()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(members, SUMMARY_MEMBERS);
    let operations: Vec<Operation> = server.requests().iter().map(|r| r.operation).collect();
    assert_eq!(operations, [Operation::Acquire, Operation::Renew]);
    let lock = server
        .locks()
        .into_iter()
        .find(|l| l.key == "report")
        .unwrap();
    let kept = (lock.expires_at - began).to_std().unwrap();
    assert!(
        kept >= Duration::from_secs(60) && kept <= Duration::from_secs(62),
        "kept {kept:?}"
    );
    let skipped = ended(run(&server)).await;
    assert_eq!(skipped.code, Some(3), "{}", skipped.stderr);
    server.advance(Duration::from_secs(63));
    let later = ended(run(&server)).await;
    assert_eq!(
        later.code,
        Some(0),
        "free after the minimum: {}",
        later.stderr
    );

    for (min, max) in [("91d", None), ("10s", Some("5s"))] {
        let sent = server.requests().len();
        let mut args = vec!["locks", "run", "other", "--min-hold", min];
        if let Some(max) = max {
            args.extend(["--max-hold", max]);
        }
        args.extend(["--", "true"]);
        let refused = volcano(&server, &args).output().await.unwrap();
        assert_eq!(refused.status.code(), Some(2), "{min}: {refused:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("min_hold"), "{stderr}");
        assert_eq!(server.requests().len(), sent, "{min}: nothing sent");
    }
}

#[tokio::test]
async fn a_force_released_lock_stops_the_command_and_exits_8() {
    let server = MockServer::start().await;
    let dir = scratch("lost");
    let mark = dir.join("mark");
    let child = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "run",
            "report",
            "--ttl",
            "5",
            "--",
            "/bin/sh",
            "-c",
            &records_sigterm(&mark),
        ],
    )
    .spawn()
    .unwrap();
    started(&mark).await;
    // Someone else takes it: the next renewal is refused.
    force_release(&server, "report").await;
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(8), "{}", ended.stderr);
    assert!(ended.stderr.contains("lost"), "{}", ended.stderr);
    assert!(ended.stderr.contains("SIGTERM"), "{}", ended.stderr);
    assert_eq!(
        std::fs::read_to_string(&mark).unwrap_or_default().trim(),
        "terminated",
        "the command received SIGTERM"
    );
    let summary = ended.summary();
    assert_eq!(summary["lost"], true);
    assert_eq!(summary["lost_reason"], "renewal failed");
    assert_eq!(summary["exit_code"], 0);
}

#[tokio::test]
async fn a_command_that_ignores_sigterm_is_killed_after_kill_after() {
    let server = MockServer::start().await;
    let child = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "run",
            "report",
            "--ttl",
            "5",
            "--kill-after",
            "1s",
            "--",
            "/bin/sh",
            "-c",
            "trap '' TERM; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
        ],
    )
    .spawn()
    .unwrap();
    server
        .wait_for(Operation::Acquire, 201, Duration::from_secs(10))
        .await
        .expect("acquired");
    force_release(&server, "report").await;
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(8), "{}", ended.stderr);
    assert!(ended.stderr.contains("SIGKILL"), "{}", ended.stderr);
    assert_eq!(ended.summary()["signal"], 9);
}

#[tokio::test]
async fn a_held_lock_exits_3_without_starting_the_command_unless_asked_to_wait() {
    let server = MockServer::start().await;
    let dir = scratch("held");
    let mark = dir.join("ran");
    let script = format!("echo ran > {}", mark.display());
    let locks = volcano::Client::for_mock(&server).locks();
    let other = locks
        .acquire("report", Duration::from_secs(30))
        .await
        .unwrap();

    let refused = volcano(
        &server,
        &[
            "--output", "json", "locks", "run", "report", "--", "/bin/sh", "-c", &script,
        ],
    )
    .spawn()
    .unwrap();
    let refused = ended(refused).await;
    assert_eq!(refused.code, Some(3), "{}", refused.stderr);
    let error: Value = serde_json::from_str(refused.stderr.lines().last().unwrap()).unwrap();
    assert_eq!(error["code"], "lock_held");
    assert!(!mark.exists(), "the command did not run");

    let waiting = volcano(
        &server,
        &[
            "locks", "run", "report", "--wait", "20s", "--", "/bin/sh", "-c", &script,
        ],
    )
    .spawn()
    .unwrap();
    server
        .wait_for(Operation::Get, 200, Duration::from_secs(10))
        .await
        .expect("the waiting run asked who holds the lock");
    locks.release(&other).await.unwrap();
    let waited = ended(waiting).await;
    assert_eq!(waited.code, Some(0), "{}", waited.stderr);
    assert!(mark.exists(), "the command ran once the lock was free");
    assert!(!live(&server, "report"));
}

#[tokio::test]
async fn a_held_lock_can_be_a_quiet_skip_for_cron() {
    let server = MockServer::start().await;
    let dir = scratch("skip");
    let mark = dir.join("ran");
    let script = format!("echo ran > {}", mark.display());
    let locks = volcano::Client::for_mock(&server).locks();
    let _other = locks
        .acquire("report", Duration::from_secs(30))
        .await
        .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["locks", "run", "report"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/bin/sh", "-c", &script]);
        volcano(&server, &args).spawn().unwrap()
    };
    // A skip that is a success, with one line saying so.
    let skipped = ended(run(&["--held-exit-code", "0"])).await;
    assert_eq!(skipped.code, Some(0), "{}", skipped.stderr);
    assert_eq!(skipped.stderr.lines().count(), 1, "{}", skipped.stderr);
    assert!(
        skipped.stderr.contains("report is held elsewhere; skipped"),
        "{}",
        skipped.stderr
    );
    assert!(skipped.stdout.is_empty());
    let json = ended(run(&["--held-exit-code", "0", "--output", "json"])).await;
    assert_eq!(json.code, Some(0));
    let said: Value = serde_json::from_str(json.stderr.trim()).unwrap();
    assert_eq!(
        (said["skipped"].as_bool(), said["exit_code"].as_u64()),
        (Some(true), Some(0))
    );
    // Quiet: nothing at all, whatever the code.
    let quiet = ended(run(&["--held-exit-code", "75", "--quiet"])).await;
    assert_eq!(quiet.code, Some(75));
    assert_eq!((quiet.stdout.as_str(), quiet.stderr.as_str()), ("", ""));
    let quiet_default = ended(run(&["--quiet"])).await;
    assert_eq!(quiet_default.code, Some(3));
    assert!(quiet_default.stderr.is_empty(), "{}", quiet_default.stderr);
    assert!(!mark.exists(), "the command never ran");
    // Other failures still speak up: a bad key is not a skip.
    let bad = ended(
        volcano(
            &server,
            &[
                "locks",
                "run",
                "bad key",
                "--held-exit-code",
                "0",
                "--quiet",
                "--",
                "true",
            ],
        )
        .spawn()
        .unwrap(),
    )
    .await;
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(!bad.stderr.is_empty());
}

#[tokio::test]
async fn watch_prints_a_line_per_change_until_interrupted() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let server = MockServer::start().await;
    let locks = volcano::Client::for_mock(&server).locks();
    let mut watch = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "watch",
            "report",
            "--interval",
            "100ms",
        ],
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    async fn next(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("a line within 10 s")
            .unwrap()
            .expect("watch still running");
        serde_json::from_str::<Value>(&line).unwrap()
    }
    assert_eq!(next(&mut lines).await["event"], "free");
    let lease = locks
        .acquire("report", Duration::from_secs(30))
        .await
        .unwrap();
    let acquired = next(&mut lines).await;
    assert_eq!(
        (
            acquired["event"].as_str(),
            acquired["fencing_token"].as_i64()
        ),
        (Some("acquired"), Some(1))
    );
    locks.renew(&lease, Duration::from_secs(60)).await.unwrap();
    assert_eq!(next(&mut lines).await["event"], "renewed");
    locks.release(&lease).await.unwrap();
    assert_eq!(next(&mut lines).await["event"], "released");
    let _second = locks
        .acquire("report", Duration::from_secs(5))
        .await
        .unwrap();
    // Left to expire: the protocol's shortest TTL, 5 s, in real time (watch
    // tells an expiry from a release by this machine's clock).
    assert_eq!(next(&mut lines).await["fencing_token"], 2);
    assert_eq!(next(&mut lines).await["event"], "expired");
    // About ten requests a second at this interval; the default is 2 s.
    sigterm(&watch);
    let status = tokio::time::timeout(Duration::from_secs(10), watch.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn watch_backs_off_on_429_and_refuses_a_bad_key() {
    let server = MockServer::builder().rate_limit(3).start().await;
    let watch = volcano(
        &server,
        &["locks", "watch", "a", "b", "--interval", "100ms"],
    )
    .spawn()
    .unwrap();
    server
        .wait_for(Operation::Get, 429, Duration::from_secs(10))
        .await
        .expect("the quota ran out");
    // It waits out Retry-After (the rest of the minute): no more requests.
    let asked = server.requests().len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        server.requests().len(),
        asked,
        "no request while backing off"
    );
    sigterm(&watch);
    let watched = ended(watch).await;
    assert_eq!(watched.code, Some(0), "{}", watched.stderr);
    assert!(watched.stderr.contains("next try in"), "{}", watched.stderr);
    assert_eq!(
        watched.stdout.lines().count(),
        2,
        "a and b once each: {}",
        watched.stdout
    );

    let bad = ended(
        volcano(&server, &["locks", "watch", "bad key"])
            .spawn()
            .unwrap(),
    )
    .await;
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
}

#[tokio::test]
async fn sigterm_to_the_cli_reaches_the_command_and_the_lock_is_released() {
    let server = MockServer::start().await;
    let dir = scratch("signal");
    let mark = dir.join("mark");
    let child = volcano(
        &server,
        &[
            "locks",
            "run",
            "report",
            "--",
            "/bin/sh",
            "-c",
            &records_sigterm(&mark),
        ],
    )
    .spawn()
    .unwrap();
    started(&mark).await;
    sigterm(&child);
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(0), "{}", ended.stderr);
    assert_eq!(
        std::fs::read_to_string(&mark).unwrap_or_default().trim(),
        "terminated"
    );
    assert!(!live(&server, "report"));
}

#[tokio::test]
async fn a_command_that_cannot_start_exits_127_and_releases_the_lock() {
    let server = MockServer::start().await;
    let child = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "run",
            "report",
            "--",
            "/nonexistent/command",
        ],
    )
    .spawn()
    .unwrap();
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(127), "{}", ended.stderr);
    assert!(ended.stderr.contains("cannot start"), "{}", ended.stderr);
    let summary = ended.summary();
    assert_eq!(summary["started"], false);
    // One shape for every summary: each member present, null when empty.
    let members: Vec<&str> = summary
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(members, SUMMARY_MEMBERS, "{summary}");
    assert!(summary["lost_reason"].is_null(), "{summary}");
    assert!(!live(&server, "report"));
    assert!(server
        .requests()
        .iter()
        .any(|r| r.operation == Operation::Release && r.status == Some(204)));
}

#[tokio::test]
async fn on_a_loss_everything_the_command_started_is_stopped() {
    let server = MockServer::start().await;
    let dir = scratch("group");
    let mark = dir.join("mark");
    let pidfile = dir.join("grandchild");
    // The shell starts a grandchild and waits for it: SIGTERM to the shell
    // alone would leave the grandchild running without the lock.
    let script = format!(
        "sleep 300 & echo $! > {}; echo started > {}.started; wait",
        pidfile.display(),
        mark.display()
    );
    let child = volcano(
        &server,
        &[
            "locks",
            "run",
            "report",
            "--ttl",
            "5",
            "--kill-after",
            "2s",
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    )
    .spawn()
    .unwrap();
    started(&mark).await;
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    force_release(&server, "report").await;
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(8), "{}", ended.stderr);
    let pid = rustix::process::Pid::from_raw(grandchild).unwrap();
    // Gone, or at most a zombie waiting for init to reap it.
    let alive = rustix::process::test_kill_process(pid).is_ok()
        && !std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
            .unwrap_or_default()
            .contains(") Z");
    assert!(!alive, "the grandchild {grandchild} outlived the lock");
}

#[tokio::test]
async fn a_signal_while_acquiring_with_a_callers_token_leaves_no_lease_behind() {
    use volcano_mock_server::Fault;
    let server = MockServer::start().await;
    // The server grants the lease but holds the answer.
    server.inject(Fault::delay_response(Duration::from_secs(20)).on(Operation::Acquire));
    let child = volcano(
        &server,
        &[
            "locks",
            "run",
            "report",
            "--token",
            "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
            "--",
            "/bin/true",
        ],
    )
    .spawn()
    .unwrap();
    server
        .wait_for(Operation::Acquire, 201, Duration::from_secs(10))
        .await
        .expect("the acquire was applied");
    assert!(live(&server, "report"));
    sigterm(&child);
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(143), "{}", ended.stderr);
    assert!(ended.stderr.contains("not started"), "{}", ended.stderr);
    assert!(!live(&server, "report"), "the granted lease was released");
    let released = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Release && r.status == Some(204))
        .count();
    assert_eq!(released, 1, "released once, by run itself");
}

#[tokio::test]
async fn a_command_killed_by_a_signal_exits_128_plus_its_number() {
    let server = MockServer::start().await;
    let child = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "run",
            "report",
            "--",
            "/bin/sh",
            "-c",
            "kill -KILL $$",
        ],
    )
    .spawn()
    .unwrap();
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(137), "{}", ended.stderr);
    let summary = ended.summary();
    assert_eq!(summary["signal"], 9, "{summary}");
    assert_eq!(summary["lost"], false, "{summary}");
    assert!(!live(&server, "report"), "released after the command died");
}

/// In the foreground of a terminal, with standard input redirected, the
/// command stays in the terminal's foreground group and can read
/// `/dev/tty`. (Put in a group of its own, it would be stopped by SIGTTIN
/// there while the CLI kept renewing.) `script` gives the CLI a terminal
/// and types into it.
#[tokio::test]
async fn in_a_terminals_foreground_with_stdin_redirected_the_command_reads_the_terminal() {
    use tokio::io::AsyncWriteExt;
    let server = MockServer::start().await;
    let dir = scratch("tty");
    let mark = dir.join("mark");
    let inner = format!(
        "{} locks run tty-key --ttl 5 -- sh -c 'read line < /dev/tty; echo \"$line\" > {}' < /dev/null",
        env!("CARGO_BIN_EXE_volcano"),
        mark.display()
    );
    let mut script = Command::new("script");
    script
        .args(["-qec", &inner, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("VOLCANO_API_URL", server.url())
        .env("VOLCANO_SERVICE_KEY", server.service_key())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = script.spawn().expect("script(1) from util-linux");
    let mut typing = child.stdin.take().unwrap();
    typing.write_all(b"typed at the terminal\n").await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while !std::fs::read_to_string(&mark).is_ok_and(|s| s.ends_with('\n')) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the command never read the terminal (stopped by SIGTTIN?)"
    );
    assert_eq!(
        std::fs::read_to_string(&mark).unwrap(),
        "typed at the terminal\n"
    );
    drop(typing);
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(0), "{}{}", ended.stdout, ended.stderr);
    assert!(!live(&server, "tty-key"), "released");
}

/// `--max-hold`: at the cap the command gets SIGTERM, the lock is
/// released, and the exit code is 9.
#[tokio::test]
async fn max_hold_stops_the_command_and_exits_9() {
    let server = MockServer::start().await;
    let dir = scratch("max-hold");
    let mark = dir.join("mark");
    let child = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "run",
            "report",
            "--ttl",
            "5",
            "--max-hold",
            "1s",
            "--",
            "/bin/sh",
            "-c",
            &records_sigterm(&mark),
        ],
    )
    .spawn()
    .unwrap();
    started(&mark).await;
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(9), "{}", ended.stderr);
    assert_eq!(
        std::fs::read_to_string(&mark).unwrap_or_default().trim(),
        "terminated",
        "the command received SIGTERM"
    );
    let summary = ended.summary();
    assert_eq!(summary["lost"], true);
    assert!(!live(&server, "report"), "released");
}

/// A script that writes `mark.started`, then waits (up to a minute) for
/// `mark.go` to exist and exits 0.
fn waits_for_go(mark: &Path) -> String {
    format!(
        "echo started > {0}.started; i=0; while [ ! -e {0}.go ] && [ $i -lt 600 ]; do \
         sleep 0.1; i=$((i+1)); done; exit 0",
        mark.display()
    )
}

/// The lease is force-released and taken by another token while the
/// command runs, before any renewal (ttl 60 s): only the final release,
/// answered "ownership lost", can tell. The command's work was done, at
/// least in part, without the lock: exit 8, never 0.
#[tokio::test]
async fn a_lock_taken_over_before_any_renewal_exits_8() {
    let server = MockServer::start().await;
    let dir = scratch("taken");
    let mark = dir.join("mark");
    let child = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "run",
            "report",
            "--ttl",
            "60",
            "--",
            "/bin/sh",
            "-c",
            &waits_for_go(&mark),
        ],
    )
    .spawn()
    .unwrap();
    started(&mark).await;
    force_release(&server, "report").await;
    let other = volcano::Client::for_mock(&server).locks();
    let theirs = other
        .acquire("report", Duration::from_secs(60))
        .await
        .unwrap();
    std::fs::write(mark.with_extension("go"), "go").unwrap();
    let ended = ended(child).await;
    assert_eq!(ended.code, Some(8), "{}", ended.stderr);
    let summary = ended.summary();
    assert_eq!(summary["lost"], true, "{summary}");
    assert_eq!(
        summary["lost_reason"],
        "another token held the lock when it was released"
    );
    assert_eq!(summary["exit_code"], 0, "the command itself succeeded");
    assert!(
        ended.stderr.contains("without the lock"),
        "{}",
        ended.stderr
    );
    assert!(
        !ended.stderr.contains("expires within its ttl"),
        "it is another holder's lock: {}",
        ended.stderr
    );
    // The other holder's lease is untouched.
    let state = other.get("report").await.unwrap();
    assert_eq!(state.fencing_token(), Some(theirs.fencing_token()));
    assert!(state.held());
}

#[tokio::test]
async fn run_keeps_its_commands_exit_code_when_nobody_reads_its_output() {
    let server = MockServer::start().await;
    let output = volcano(
        &server,
        &[
            "--output", "json", "locks", "run", "report", "--", "/bin/sh", "-c", "exit 3",
        ],
    )
    .stdout(closed_pipe())
    // Not `output()`: it would capture standard output.
    .spawn()
    .unwrap()
    .wait_with_output()
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!live(&server, "report"), "released");
}

/// `watch ... | head -1`: once the reader is gone, watch stops polling the
/// service (and spending the project's quota) without waiting for a
/// change to write.
#[tokio::test]
async fn watch_stops_when_nobody_reads_its_output() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let server = MockServer::start().await;
    let mut watch = volcano(&server, &["locks", "watch", "quiet", "--interval", "100ms"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("a first line")
        .unwrap()
        .unwrap();
    assert!(first.ends_with("quiet free"), "{first}");
    drop(lines);
    let status = tokio::time::timeout(Duration::from_secs(10), watch.wait())
        .await
        .expect("watch ends with nobody reading, though nothing changes")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let sent = server.requests().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(server.requests().len(), sent, "no request after it ended");
}

/// `--permits N`: the command runs under a permit of the semaphore (its
/// key and fencing token in its environment); with every permit held it
/// is not started and the exit code is 3; `locks status NAME --permits N`
/// shows each permit.
#[tokio::test]
async fn run_under_a_permit_and_status_of_a_semaphore() {
    let server = MockServer::start().await;
    let ran = volcano(
        &server,
        &[
            "--output", "json", "locks", "run", "pool", "--permits", "2", "--", "sh", "-c",
            "test -n \"$VOLCANO_FENCING_TOKEN\" && case \"$VOLCANO_LOCK_KEY\" in pool:0|pool:1) exit 0;; *) exit 9;; esac",
        ],
    )
    .spawn()
    .unwrap();
    let ran = ended(ran).await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let key = ran.summary()["key"].as_str().unwrap().to_owned();
    assert!(key == "pool:0" || key == "pool:1", "{key}");

    let client = volcano::Client::for_mock(&server);
    let semaphore = client.locks().semaphore("pool", 2);
    let a = semaphore
        .acquire(std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let b = semaphore
        .acquire(std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let full = volcano(
        &server,
        &["locks", "run", "pool", "--permits", "2", "--", "true"],
    )
    .output()
    .await
    .unwrap();
    assert_eq!(full.status.code(), Some(3), "{full:?}");

    let status = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "status",
            "pool",
            "--permits",
            "2",
        ],
    )
    .output()
    .await
    .unwrap();
    assert_eq!(status.status.code(), Some(0), "{status:?}");
    let value: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(value["permits_held"], 2, "{value}");
    assert_eq!(value["permit_states"].as_array().map(Vec::len), Some(2));
    let refused = volcano(&server, &["locks", "status", "pool", "--permits", "0"])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    a.release().await.unwrap();
    b.release().await.unwrap();
}
