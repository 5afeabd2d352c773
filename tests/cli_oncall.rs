//! The CLI as the on-call engineer's tool: it never dies of its own output,
//! the SDK's warnings reach standard error, usage errors stay JSON with
//! `--output json`, `diagnose` says whether anyone renews a key, and
//! `force-release --if-fencing-token` drops only the lease looked at.
#![cfg(all(feature = "cli", unix))]

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use volcano_mock_server::{Fault, MockServer, Operation};

#[path = "common/cli.rs"]
mod cli;
use cli::{closed_pipe, ended, live, volcano, Ended};

/// A file every write to fails (ENOSPC).
fn full_device() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

/// An output that is gone, made anew for each use.
type Broken = fn() -> Stdio;

/// The ways an output can be gone: a pipe nobody reads, a full device.
fn broken_outputs() -> [(&'static str, Broken); 2] {
    [("a closed pipe", closed_pipe), ("/dev/full", full_device)]
}

/// Runs the CLI with standard error (and, if `stdout_too`, standard
/// output) broken; what it could not write is lost, the rest is returned.
async fn run_broken(server: &MockServer, args: &[&str], broken: Broken, stdout_too: bool) -> Ended {
    let mut command = volcano(server, args);
    command.stderr(broken());
    if stdout_too {
        command.stdout(broken());
    }
    ended(command.spawn().unwrap()).await
}

/// While a run's renewals fail (the SDK warns, twice), at its end, and
/// while it waits for a held lock or keeps a minimum it cannot keep:
/// with standard error (and standard output) broken, the command runs,
/// the lock is released and the exit code is the documented one. Before,
/// the first warning panicked the CLI (exit 101) and no release was sent.
#[tokio::test]
async fn a_broken_standard_error_changes_nothing_the_run_does() {
    for (name, broken) in broken_outputs() {
        for stdout_too in [false, true] {
            let server = MockServer::start().await;
            server.inject(Fault::status(503).on(Operation::Renew).times(2));
            let run = [
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
                "sleep 4; exit 4",
            ];
            let ran = run_broken(&server, &run, broken, stdout_too).await;
            assert_eq!(ran.code, Some(4), "{name}, stdout too: {stdout_too}");
            assert!(!live(&server, "report"), "{name}: released");
            let renewed = server
                .requests()
                .iter()
                .filter(|r| r.operation == Operation::Renew && r.status == Some(200))
                .count();
            assert!(renewed >= 1, "{name}: renewals went on after the failures");
            if !stdout_too {
                assert_eq!(ran.summary()["at_risk"], 1, "{name}");
            }
        }
        // Held elsewhere, after a wait: 3, not a panic.
        let server = MockServer::start().await;
        let other = volcano(&server, &["locks", "acquire", "report", "--ttl", "60"])
            .output()
            .await
            .unwrap();
        assert_eq!(other.status.code(), Some(0));
        let held = ["locks", "run", "report", "--wait", "1s", "--", "true"];
        assert_eq!(
            run_broken(&server, &held, broken, true).await.code,
            Some(3),
            "{name}"
        );
        // A minimum the service cannot keep: said nowhere, and still 0.
        let server = MockServer::start().await;
        server.inject(Fault::status(503).on(Operation::Renew));
        let keep = [
            "locks",
            "run",
            "kept",
            "--ttl",
            "5",
            "--min-hold",
            "30s",
            "--",
            "true",
        ];
        assert_eq!(
            run_broken(&server, &keep, broken, true).await.code,
            Some(0),
            "{name}"
        );
    }
}

/// A reader of standard error that is alive but never reads (a hung log
/// shipper), with the command's own output filling the pipe: the SDK's
/// warnings about failing renewals do not block the CLI's one thread, so
/// renewals go on, the command's code comes back and the lock is
/// released. Before, the first warning blocked the CLI for good.
#[tokio::test]
async fn a_stalled_standard_error_blocks_nothing() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Renew).times(3));
    let (stalled, reader) = tokio::net::unix::pipe::pipe().unwrap();
    let fill = "(head -c 300000 /dev/zero >&2 &); sleep 4; exit 5";
    let child = volcano(
        &server,
        &[
            "locks", "run", "report", "--ttl", "5", "--", "/bin/sh", "-c", fill,
        ],
    )
    .stderr(Stdio::from(stalled.into_blocking_fd().unwrap()))
    .spawn()
    .unwrap();
    let ran = ended(child).await;
    assert_eq!(ran.code, Some(5));
    assert!(!live(&server, "report"), "released");
    let renewed = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Renew && r.status == Some(200))
        .count();
    assert!(renewed >= 1, "renewals went on");
    drop(reader);
}

/// A failed keep of `--min-hold` is said: the SDK's WARN line on standard
/// error, `min_hold_kept: false` in the summary (the exit code stays the
/// command's). A kept minimum says `true`; no `--min-hold`, `null`.
/// Before, the run exited 0 with an empty standard error.
#[tokio::test]
async fn a_minimum_hold_not_kept_is_said_and_a_kept_one_too() {
    let run = |server: &MockServer, key: &str, extra: &[&str]| {
        let mut args = vec!["--output", "json", "locks", "run", key, "--ttl", "5"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "true"]);
        let child = volcano(server, &args).spawn().unwrap();
        ended(child)
    };
    let server = MockServer::start().await;
    let kept = run(&server, "kept", &["--min-hold", "30s"]).await;
    assert_eq!(kept.code, Some(0), "{}", kept.stderr);
    assert_eq!(kept.summary()["min_hold_kept"], true, "{}", kept.stdout);
    assert!(live(&server, "kept"), "the service keeps it");
    let plain = run(&server, "plain", &[]).await;
    assert_eq!(plain.summary()["min_hold_kept"], Value::Null);

    server.inject(Fault::status(503).on(Operation::Renew).key("lost"));
    let not_kept = run(&server, "lost", &["--min-hold", "30s"]).await;
    assert_eq!(not_kept.code, Some(0), "{}", not_kept.stderr);
    assert_eq!(
        not_kept.summary()["min_hold_kept"],
        false,
        "{}",
        not_kept.stdout
    );
    let logged: Vec<Value> = not_kept
        .stderr
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert!(
        logged.iter().any(|l| l["level"] == "warn"
            && l["message"]
                .as_str()
                .unwrap_or("")
                .contains("minimum hold not kept")),
        "{}",
        not_kept.stderr
    );
}

/// The SDK's lines in the CLI's format: WARN by default; `locks run` adds
/// the INFO line that names the holder (key, fencing token, host, pid),
/// which `--quiet` leaves out; `RUST_LOG` changes the level; no secret in
/// any of it.
#[tokio::test]
async fn the_sdks_log_lines_reach_standard_error() {
    let server = MockServer::start().await;
    let run = |env: Option<&str>, extra: &[&str]| {
        server.inject(Fault::status(503).on(Operation::Renew).times(1));
        let mut args = vec!["locks", "run", "report", "--ttl", "5"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/bin/sh", "-c", "sleep 3"]);
        let mut command = volcano(&server, &args);
        if let Some(level) = env {
            command.env("RUST_LOG", level);
        }
        ended(command.spawn().unwrap())
    };
    let said = run(None, &[]).await;
    assert_eq!(said.code, Some(0), "{}", said.stderr);
    let acquired = said
        .stderr
        .lines()
        .find(|l| l.starts_with("volcano: info: lock acquired"))
        .unwrap_or_else(|| panic!("no acquire line: {}", said.stderr));
    for field in ["key=report", "fencing_token=", "host=", "pid="] {
        assert!(acquired.contains(field), "{acquired}");
    }
    assert!(
        said.stderr
            .contains("volcano: warning: renewal failed; retrying"),
        "{}",
        said.stderr
    );
    assert!(!said.stderr.contains(server.service_key()));

    let quiet = run(None, &["--quiet"]).await;
    assert!(!quiet.stderr.contains("lock acquired"), "{}", quiet.stderr);
    assert!(quiet.stderr.contains("renewal failed"), "{}", quiet.stderr);

    let errors_only = run(Some("error"), &[]).await;
    assert_eq!(errors_only.stderr, "", "RUST_LOG=error");
}

/// Every usage error with `--output json` is the documented error object
/// on standard error (clap's own included); without it, clap's text.
#[tokio::test]
async fn usage_errors_are_json_with_output_json() {
    let server = MockServer::start().await;
    for bad in [
        &["locks", "run", "k", "--permits", "-1", "--", "true"][..],
        &["locks", "run", "k", "--permits", "4294967296", "--", "true"],
        &["locks", "run", "k", "--permits", "0", "--", "true"],
        &["locks", "get", "k", "--no-such-flag"],
        &["locks", "get"],
        &["locks", "frobnicate"],
    ] {
        for json in [true, false] {
            let mut args = if json {
                vec!["--output", "json"]
            } else {
                vec![]
            };
            args.extend_from_slice(bad);
            let out = volcano(&server, &args).output().await.unwrap();
            assert_eq!(out.status.code(), Some(2), "{bad:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            let parsed: Result<Value, _> = serde_json::from_str(stderr.trim());
            if json {
                let error = parsed.unwrap_or_else(|e| panic!("{bad:?}: {e}: {stderr}"));
                assert_eq!(error["exit_code"], 2, "{error}");
                assert!(!error["error"].as_str().unwrap().is_empty(), "{error}");
                for member in ["status", "code", "request_id", "retry_after_secs"] {
                    assert!(error.get(member).is_some(), "{member}: {error}");
                }
            } else {
                assert!(parsed.is_err(), "{bad:?}: text without --output json");
            }
        }
    }
    // `--output json` after `--` belongs to the command: not asked for.
    let out = volcano(&server, &["locks", "run", "--", "x", "--output", "json"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(serde_json::from_slice::<Value>(&out.stderr).is_err());
}

/// The gets of `key` the mock has answered.
fn gets(server: &MockServer, key: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Get && r.key == key && r.status.is_some())
        .count()
}

/// Waits until the mock has answered `n` gets of `key`.
async fn gets_seen(server: &MockServer, key: &str, n: usize) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while gets(server, key) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("diagnose looks at the key");
}

/// `locks diagnose KEY --output json`, spawned.
fn diagnose(server: &MockServer, key: &str) -> tokio::process::Child {
    volcano(
        server,
        &[
            "--output",
            "json",
            "locks",
            "diagnose",
            key,
            "--interval",
            "500ms",
        ],
    )
    .spawn()
    .unwrap()
}

async fn verdict(child: tokio::process::Child) -> Value {
    let done = ended(child).await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    done.summary()
}

/// `locks acquire KEY --token T --ttl TTL` by the CLI: the lease's fence.
async fn acquire(server: &MockServer, key: &str, token: &str, ttl: &str) -> i64 {
    let out = volcano(
        server,
        &[
            "--output", "json", "locks", "acquire", key, "--token", token, "--ttl", ttl,
        ],
    )
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let lease: Value = serde_json::from_slice(&out.stdout).unwrap();
    lease["fencing_token"].as_i64().unwrap()
}

const TOKEN: &str = "0b0c8a3e-6f55-4d0a-9a43-2f4c1f1d0e77";

/// Each verdict against the mock: a free key; a live `locks run`
/// (renewed); a release while watched; a lease left to expire; a long
/// lease nobody renews (the mock's clock moved past the longest renewal
/// interval, so the watch ends at once).
#[tokio::test]
async fn diagnose_says_free_renewed_released_expired_and_unrenewed() {
    let server = MockServer::start().await;

    let free = verdict(diagnose(&server, "nobody")).await;
    assert_eq!(free["verdict"], "free", "{free}");
    // In text, the verdict and what to do.
    let text = volcano(&server, &["locks", "diagnose", "nobody"])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&text.stdout);
    assert_eq!(said.trim(), "nobody: free (nobody holds it)");

    let live_run = volcano(
        &server,
        &["locks", "run", "busy", "--ttl", "5", "--", "sleep", "8"],
    )
    .spawn()
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !live(&server, "busy") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let renewed = verdict(diagnose(&server, "busy")).await;
    assert_eq!(renewed["verdict"], "renewed", "{renewed}");
    assert!(renewed["watched_ms"].as_u64().unwrap() < 5_000, "{renewed}");
    assert_eq!(ended(live_run).await.code, Some(0));

    let fence = acquire(&server, "done", TOKEN, "60").await;
    let watching = diagnose(&server, "done");
    gets_seen(&server, "done", 1).await;
    let released = volcano(&server, &["locks", "release", "done", "--token", TOKEN])
        .output()
        .await
        .unwrap();
    assert_eq!(released.status.code(), Some(0));
    let released = verdict(watching).await;
    assert_eq!(released["verdict"], "released", "{released}");
    assert_eq!(released["fencing_token"], fence);

    acquire(&server, "died", TOKEN, "30").await;
    let watching = diagnose(&server, "died");
    gets_seen(&server, "died", 1).await;
    server.advance(Duration::from_secs(31));
    let expired = verdict(watching).await;
    assert_eq!(expired["verdict"], "expired", "{expired}");

    let fence = acquire(&server, "stuck", TOKEN, "3600").await;
    let mut watching = diagnose(&server, "stuck");
    gets_seen(&server, "stuck", 1).await;
    // Not yet: 66 s is the longest interval, the watch adds 4 s for the
    // renewal's trip (and counts the `Date` a second short).
    server.advance(Duration::from_secs(66));
    let looked = gets(&server, "stuck");
    gets_seen(&server, "stuck", looked + 1).await;
    assert!(watching.try_wait().unwrap().is_none(), "no verdict at 66 s");
    server.advance(Duration::from_secs(9));
    let stuck = verdict(watching).await;
    assert_eq!(stuck["verdict"], "unrenewed", "{stuck}");
    assert_eq!(stuck["fencing_token"], fence);
    assert!(stuck["watched_ms"].as_u64().unwrap() >= 70_000, "{stuck}");
    // One look every --interval at most: never more than the watch allows.
    assert!(stuck["looks"].as_u64().unwrap() <= 36, "{stuck}");
    let advice = stuck["advice"].as_str().unwrap();
    assert!(
        advice.contains(&format!("--if-fencing-token {fence}")),
        "{advice}"
    );
    assert!(live(&server, "stuck"), "diagnose changes nothing");
}

/// `force-release --if-fencing-token N`: a wrong token or a free key exits
/// 7 and releases nothing; the right one releases.
#[tokio::test]
async fn force_release_if_fencing_token_drops_only_the_lease_named() {
    let server = MockServer::start().await;
    let fence = acquire(&server, "job", TOKEN, "60").await;
    let force = |token: i64| {
        let token = token.to_string();
        let server = &server;
        async move {
            volcano(
                server,
                &[
                    "locks",
                    "force-release",
                    "job",
                    "--yes",
                    "--if-fencing-token",
                    &token,
                ],
            )
            .output()
            .await
            .unwrap()
        }
    };
    let wrong = force(fence + 1).await;
    assert_eq!(wrong.status.code(), Some(7), "{wrong:?}");
    assert!(String::from_utf8_lossy(&wrong.stderr).contains(&format!("fencing token {fence}")));
    assert!(live(&server, "job"), "nothing released");
    let forced = server
        .requests()
        .iter()
        .any(|r| r.operation == Operation::ForceRelease);
    assert!(!forced, "no force-release was sent");

    let right = force(fence).await;
    assert_eq!(right.status.code(), Some(0), "{right:?}");
    assert!(!live(&server, "job"));

    let again = force(fence).await;
    assert_eq!(again.status.code(), Some(7), "a free key: {again:?}");

    // A look that fails (the service answering 503) checks nothing: exit
    // 7, and no force-release is sent.
    let fence = acquire(&server, "job", TOKEN, "60").await;
    server.inject(Fault::status(503).on(Operation::Get));
    let blind = force(fence).await;
    assert_eq!(blind.status.code(), Some(7), "{blind:?}");
    assert!(String::from_utf8_lossy(&blind.stderr).contains("nothing was released"));
    assert!(live(&server, "job"));
    let forced = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::ForceRelease)
        .count();
    assert_eq!(forced, 1, "only the right token's earlier force-release");
}
