//! The `volcano` admin CLI, run as a process against the mock server.
#![cfg(feature = "cli")]

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;
use volcano_mock_server::{Fault, MockServer, Operation};

const TOKEN: &str = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee";
const RID: &str = "11111111-2222-4333-8444-555555555555";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
    fn error_json(&self) -> Value {
        let line = self.stderr.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", self.stderr))
    }
}

async fn volcano(server: &MockServer, args: &[&str]) -> Run {
    volcano_with_key(server, server.service_key(), args).await
}

async fn volcano_with_key(server: &MockServer, service_key: &str, args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_volcano"))
        .args(args)
        .env_clear()
        .env("VOLCANO_API_URL", server.url())
        .env("VOLCANO_SERVICE_KEY", service_key)
        .env("VOLCANO_ANON_KEY", server.anon_key())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("the CLI runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[tokio::test]
async fn get_acquire_renew_release_in_both_formats() {
    let server = MockServer::start().await;

    let free = volcano(&server, &["locks", "get", "daily-report"]).await;
    assert_eq!(
        (free.code, free.stdout.trim()),
        (0, "daily-report: free"),
        "{}",
        free.stderr
    );
    let free = volcano(
        &server,
        &["--output", "json", "locks", "get", "daily-report"],
    )
    .await;
    assert_eq!(
        free.json(),
        serde_json::json!({"key": "daily-report", "held": false, "expires_at": null, "fencing_token": null, "time_remaining_ms": null})
    );

    let acquired = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "acquire",
            "daily-report",
            "--ttl",
            "30s",
            "--token",
            TOKEN,
            "--request-id",
            RID,
        ],
    )
    .await;
    assert_eq!(acquired.code, 0, "{}", acquired.stderr);
    let lease = acquired.json();
    assert_eq!(lease["key"], "daily-report");
    assert_eq!(lease["held"], true);
    assert_eq!(lease["fencing_token"], 1);
    assert!(lease["expires_at"].as_str().unwrap().ends_with('Z'));
    assert!(lease.get("token").is_none(), "tokens only on request");
    assert_eq!(server.requests()[2].request_id.as_deref(), Some(RID));

    let held = volcano(&server, &["locks", "get", "daily-report"]).await;
    assert!(
        held.stdout.starts_with("daily-report: held until "),
        "{}",
        held.stdout
    );
    assert!(
        held.stdout.contains("(fencing token 1, "),
        "{}",
        held.stdout
    );
    assert!(
        held.stdout.trim_end().ends_with(" s left)"),
        "{}",
        held.stdout
    );
    let held = volcano(
        &server,
        &["--output", "json", "locks", "get", "daily-report"],
    )
    .await;
    let left = held.json()["time_remaining_ms"].as_i64().unwrap();
    assert!((20_000..=30_000).contains(&left), "{left}");

    let renewed = volcano(
        &server,
        &[
            "locks",
            "renew",
            "daily-report",
            "--token",
            TOKEN,
            "--ttl",
            "60",
        ],
    )
    .await;
    assert_eq!(renewed.code, 0, "{}", renewed.stderr);
    assert!(renewed.stdout.contains("fencing token 1"));

    let released = volcano(
        &server,
        &["locks", "release", "daily-report", "--token", TOKEN],
    )
    .await;
    assert_eq!(
        (released.code, released.stdout.trim()),
        (0, "released daily-report")
    );
    let released = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "release",
            "daily-report",
            "--token",
            TOKEN,
        ],
    )
    .await;
    // Released already: the second release says that nothing was held.
    assert_eq!(
        released.json(),
        serde_json::json!({"key": "daily-report", "released": false, "was_held": false})
    );
    assert!(server.locks().is_empty());
}

#[tokio::test]
async fn a_release_after_a_force_release_says_the_lease_was_gone() {
    let server = MockServer::start().await;
    let acquired = volcano(
        &server,
        &[
            "locks",
            "acquire",
            "stuck-job",
            "--token",
            TOKEN,
            "--ttl",
            "60",
        ],
    )
    .await;
    assert_eq!(acquired.code, 0, "{}", acquired.stderr);
    let forced = volcano(&server, &["locks", "force-release", "stuck-job", "--yes"]).await;
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    let released = volcano(
        &server,
        &["locks", "release", "stuck-job", "--token", TOKEN],
    )
    .await;
    assert_eq!(released.code, 0, "{}", released.stderr);
    assert!(
        released.stdout.contains("stuck-job was not held by anyone")
            && !released.stdout.starts_with("released"),
        "{}",
        released.stdout
    );
}

#[tokio::test]
async fn acquire_shows_the_token_only_when_asked() {
    let server = MockServer::start().await;
    let shown = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "acquire",
            "a",
            "--ttl",
            "30",
            "--show-token",
        ],
    )
    .await;
    let token = shown.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 36);
    let released = volcano(&server, &["locks", "release", "a", "--token", &token]).await;
    assert_eq!(released.code, 0, "the shown token releases the lease");

    let hidden = volcano(&server, &["locks", "acquire", "b", "--ttl", "30"]).await;
    assert_eq!(hidden.code, 0);
    assert!(
        hidden.stderr.contains("--show-token"),
        "a hint: {}",
        hidden.stderr
    );
    assert!(!hidden.stdout.contains("token:"));
}

#[tokio::test]
async fn conflicts_exit_3_with_status_code_and_request_id() {
    let server = MockServer::start().await;
    volcano(
        &server,
        &["locks", "acquire", "job", "--ttl", "30", "--token", TOKEN],
    )
    .await;
    let held = volcano(
        &server,
        &[
            "locks",
            "acquire",
            "job",
            "--ttl",
            "30",
            "--request-id",
            RID,
        ],
    )
    .await;
    assert_eq!(held.code, 3);
    assert_eq!(held.stderr.lines().count(), 1, "one line: {}", held.stderr);
    // Status and code once each, then the request id.
    assert_eq!(held.stderr.matches("409").count(), 1, "{}", held.stderr);
    assert_eq!(
        held.stderr.matches("lock_held").count(),
        1,
        "{}",
        held.stderr
    );
    assert!(
        held.stderr.contains("HTTP 409 lock_held"),
        "{}",
        held.stderr
    );
    assert!(held.stderr.contains(RID), "{}", held.stderr);

    let lost = volcano(
        &server,
        &[
            "--output",
            "json",
            "locks",
            "renew",
            "job",
            "--ttl",
            "30",
            "--token",
            "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb",
        ],
    )
    .await;
    assert_eq!(lost.code, 3);
    let error = lost.error_json();
    assert_eq!(error["status"], 409);
    assert_eq!(error["code"], "lock_ownership_lost");
    assert_eq!(error["exit_code"], 3);
    assert!(error["request_id"].as_str().is_some());
    assert!(lost.stdout.is_empty());
}

#[tokio::test]
async fn each_error_class_has_its_exit_code() {
    let server = MockServer::builder().rate_limit(2).start().await;
    // 4: authentication
    let auth = volcano_with_key(&server, "wrong-key", &["locks", "get", "k"]).await;
    assert_eq!(auth.code, 4, "{}", auth.stderr);
    assert!(auth.stderr.contains("HTTP 401"), "{}", auth.stderr);
    assert!(
        !auth.stderr.contains("wrong-key"),
        "the key is never printed"
    );
    // 2: invalid argument, nothing sent
    let before = server.requests().len();
    let invalid = volcano(&server, &["locks", "get", "not/a/key"]).await;
    assert_eq!(invalid.code, 2, "{}", invalid.stderr);
    let invalid = volcano(&server, &["locks", "acquire", "k", "--ttl", "4"]).await;
    assert_eq!(invalid.code, 2, "{}", invalid.stderr);
    let usage = volcano(&server, &["locks", "acquire", "k", "--ttl", "soon"]).await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    assert_eq!(server.requests().len(), before);
    // 5: rate limited
    volcano(&server, &["locks", "get", "k"]).await;
    volcano(&server, &["locks", "get", "k"]).await;
    let limited = volcano(&server, &["locks", "get", "k"]).await;
    assert_eq!(limited.code, 5, "{}", limited.stderr);
    assert!(limited.stderr.contains("retry after"), "{}", limited.stderr);

    // 6: server error and transport failure
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Get).times(1));
    let unavailable = volcano(&server, &["locks", "get", "k"]).await;
    assert_eq!(unavailable.code, 6, "{}", unavailable.stderr);
    server.inject(Fault::reset().on(Operation::Get).times(1));
    let reset = volcano(&server, &["locks", "get", "k"]).await;
    assert_eq!(reset.code, 6, "{}", reset.stderr);

    // 10: no connection, nothing sent; the message names the server and why.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let refused = volcano(&server, &["--api-url", &url, "locks", "get", "k"]).await;
    assert_eq!(refused.code, 10, "{}", refused.stderr);
    let said = &refused.stderr;
    assert!(
        said.contains(&format!("could not connect to the lock service at {url}")),
        "{said}"
    );
    assert!(
        said.contains("nothing was sent") && said.to_lowercase().contains("refused"),
        "{said}"
    );
    assert_eq!(said.matches("refused").count(), 1, "the cause once: {said}");
}

#[tokio::test]
async fn force_release_needs_confirmation_or_yes() {
    let server = MockServer::start().await;
    volcano(&server, &["locks", "acquire", "job", "--ttl", "30"]).await;
    let refused = volcano(&server, &["locks", "force-release", "job"]).await;
    assert_eq!(refused.code, 7, "not confirmed: {}", refused.stderr);
    assert!(
        refused.stderr.contains("breaks mutual exclusion"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("--yes"), "{}", refused.stderr);
    assert_eq!(server.locks().len(), 1, "nothing released");

    let forced = volcano(
        &server,
        &["--output", "json", "locks", "force-release", "job", "--yes"],
    )
    .await;
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert_eq!(
        forced.json(),
        serde_json::json!({"key": "job", "force_released": true, "was_held": true, "fencing_token": 1})
    );
    assert!(
        !forced.stderr.contains("breaks mutual exclusion"),
        "with --yes the warning is for terminals only: {}",
        forced.stderr
    );
    assert!(server.locks().is_empty());

    // A free key says so rather than claim a release.
    let free = volcano(&server, &["locks", "force-release", "job", "--yes"]).await;
    assert_eq!(free.code, 0, "{}", free.stderr);
    assert_eq!(
        free.stdout.trim(),
        "job was free when checked; force-released anyway"
    );
}

#[tokio::test]
async fn acquire_can_wait_for_the_lock() {
    let server = MockServer::start().await;
    volcano(
        &server,
        &["locks", "acquire", "job", "--ttl", "5", "--token", TOKEN],
    )
    .await;
    let timed_out = volcano(
        &server,
        &["locks", "acquire", "job", "--ttl", "5", "--wait", "300ms"],
    )
    .await;
    assert_eq!(timed_out.code, 3, "{}", timed_out.stderr);
    server.advance(Duration::from_secs(7));
    let waited = volcano(
        &server,
        &["locks", "acquire", "job", "--ttl", "5", "--wait", "5s"],
    )
    .await;
    assert_eq!(waited.code, 0, "{}", waited.stderr);
    assert!(
        waited.stdout.contains("fencing token 2"),
        "{}",
        waited.stdout
    );
}

#[tokio::test]
async fn help_never_shows_secret_environment_values() {
    let server = MockServer::start().await;
    let help = volcano(&server, &["--help"]).await;
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("Exit codes"));
    assert!(
        !help.stdout.contains(server.service_key()),
        "{}",
        help.stdout
    );
    assert!(!help.stdout.contains(server.anon_key()), "{}", help.stdout);
}

/// The rows of `--help`'s exit-code table (`  N  meaning`).
fn help_exit_codes(help: &str) -> Vec<(u16, String)> {
    help.lines()
        .skip_while(|line| !line.starts_with("Exit codes:"))
        .skip(1)
        .map_while(|line| {
            let (code, meaning) = line.trim_start().split_once("  ")?;
            Some((code.parse().ok()?, meaning.to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn the_cli_guides_exit_code_table_is_the_clis() {
    let server = MockServer::start().await;
    let help = volcano(&server, &["--help"]).await.stdout;
    let from_help = help_exit_codes(&help);
    assert!(from_help.len() >= 12, "{help}");
    let guide = include_str!("../docs/guide/cli.md");
    let from_guide: Vec<(u16, String)> = guide
        .lines()
        .skip_while(|line| *line != "| exit code | meaning |")
        .skip(2)
        .map_while(|row| {
            let (code, meaning) = row
                .strip_prefix("| ")?
                .strip_suffix(" |")?
                .split_once(" | ")?;
            Some((code.parse().ok()?, meaning.to_owned()))
        })
        .collect();
    assert_eq!(from_guide, from_help);
    // `run` passes its command's code on; the rest are the CLI's own.
    assert!(help.contains("`run` otherwise exits with its command's code"));
}

#[tokio::test]
async fn help_lists_global_options_apart_and_carries_no_source_notes() {
    let server = MockServer::start().await;
    for args in [&["--help"][..], &["locks", "acquire", "--help"]] {
        let help = volcano(&server, args).await.stdout;
        let (own, global) = help
            .split_once("Global options:")
            .expect("a heading of its own");
        assert!(
            global.contains("--api-url") && !own.contains("--api-url"),
            "{help}"
        );
        assert!(!help.contains("Debug"), "{help}");
    }
    let acquire = volcano(&server, &["locks", "acquire", "--help"])
        .await
        .stdout;
    let (own, _) = acquire.split_once("Global options:").unwrap();
    assert!(own.contains("--ttl"), "{acquire}");
}

#[tokio::test]
async fn missing_service_key_is_an_invalid_argument_and_the_anon_key_is_optional() {
    let server = MockServer::start().await;
    let output = Command::new(env!("CARGO_BIN_EXE_volcano"))
        .args(["locks", "get", "k"])
        .env_clear()
        .env("VOLCANO_API_URL", server.url())
        .env("VOLCANO_ANON_KEY", server.anon_key())
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("VOLCANO_SERVICE_KEY"));

    let output = Command::new(env!("CARGO_BIN_EXE_volcano"))
        .args(["locks", "get", "k"])
        .env_clear()
        .env("VOLCANO_API_URL", server.url())
        .env("VOLCANO_SERVICE_KEY", server.service_key())
        .env("VOLCANO_ANON_KEY", "")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}

#[tokio::test]
async fn plain_http_off_loopback_needs_the_flag_and_gets_a_warning() {
    let cli = |env: &[(&str, &str)], extra: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_volcano"));
        command
            // Not loopback by the rule, yet it reaches only this machine
            // (where nothing listens on port 9): no traffic leaves it.
            .args(["--api-url", "http://0.0.0.0:9", "--timeout", "1s"])
            .args(extra)
            .args(["locks", "get", "report"])
            .env_clear()
            .env("VOLCANO_SERVICE_KEY", "secret-service-key")
            .stdin(Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = cli(&[], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--allow-insecure-http"), "{stderr}");
    for (env, flag) in [
        (&[][..], &["--allow-insecure-http"][..]),
        (&[("VOLCANO_ALLOW_INSECURE_HTTP", "1")][..], &[][..]),
    ] {
        let (code, stderr) = cli(env, flag);
        // Allowed: the CLI tries to send it (nothing listens there: the
        // connection is refused, 10, or times out, 6).
        assert!(matches!(code, Some(6 | 10)), "{code:?} {stderr}");
        assert!(
            stderr.contains("warning: --allow-insecure-http"),
            "{stderr}"
        );
        assert!(!stderr.contains("secret-service-key"), "{stderr}");
    }
    // Off: an explicit 0 means no.
    let (code, _) = cli(&[("VOLCANO_ALLOW_INSECURE_HTTP", "0")], &[]);
    assert_eq!(code, Some(2));
}

/// While waiting on a terminal, one status line says who holds the key;
/// not a line when standard error is not a terminal. (`script` gives the
/// CLI a terminal.)
#[tokio::test]
async fn waiting_on_a_terminal_shows_who_holds_the_key() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no `script` to give the CLI a terminal");
        return;
    }
    let server = MockServer::start().await;
    let locks = volcano::Client::for_mock(&server).locks();
    // Left to expire (5 s, the shortest TTL): the waiter then gets it.
    let _held = locks
        .acquire("report", Duration::from_secs(5))
        .await
        .unwrap();
    let cli = format!(
        "'{}' locks acquire report --ttl 30 --wait 20s",
        env!("CARGO_BIN_EXE_volcano")
    );
    let output = Command::new("script")
        .args(["-qec", &cli, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("VOLCANO_API_URL", server.url())
        .env("VOLCANO_SERVICE_KEY", server.service_key())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let seen = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{seen}");
    assert!(seen.contains("volcano: waiting "), "{seen}");
    assert!(seen.contains(": held, fencing token 1, ~"), "{seen}");
    // The line is cleared before the answer is printed.
    assert!(seen.contains("\x1b[2Kreport: held until"), "{seen:?}");

    // Without a terminal: no status line.
    let _held = locks
        .acquire("other", Duration::from_secs(5))
        .await
        .unwrap();
    let plain = volcano(
        &server,
        &["locks", "acquire", "other", "--ttl", "30", "--wait", "20s"],
    )
    .await;
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    assert!(!plain.stderr.contains("waiting"), "{}", plain.stderr);
}

#[tokio::test]
async fn usage_errors_say_what_a_key_may_be_and_key_has_help() {
    let server = MockServer::start().await;
    let dashed = volcano(&server, &["locks", "get", "-lock"]).await;
    assert_eq!(dashed.code, 2, "{}", dashed.stderr);
    assert!(
        dashed.stderr.contains("a KEY cannot start with '-'"),
        "{}",
        dashed.stderr
    );
    let help = volcano(&server, &["locks", "run", "--help"]).await;
    assert_eq!(help.code, 0);
    assert!(
        help.stdout.contains("The lock key: 1 to 128 letters"),
        "{}",
        help.stdout
    );
    let ttl = volcano(&server, &["locks", "acquire", "k", "--ttl", "1.5"]).await;
    assert_eq!(ttl.code, 2);
    assert!(
        ttl.stderr.contains("whole seconds") && ttl.stderr.contains("got 1.5 s"),
        "{}",
        ttl.stderr
    );
    let zero = volcano(&server, &["locks", "acquire", "k", "--ttl", "0"]).await;
    assert!(zero.stderr.contains("got 0 s"), "{}", zero.stderr);
}

/// An acquire the server applied but never answered, under a token the CLI
/// generated (nobody was shown it): the process does not exit before the
/// SDK's undo released it.
#[tokio::test]
async fn an_applied_unanswered_acquire_is_released_before_the_cli_exits() {
    let server = MockServer::start().await;
    // Both the attempt and acquire's one retry are applied, and their
    // answers dropped.
    server.inject(Fault::drop_response().on(Operation::Acquire).times(2));
    let acquire = volcano(&server, &["locks", "acquire", "nightly", "--ttl", "60"]).await;
    assert_eq!(acquire.code, 6, "{}", acquire.stderr);
    assert!(
        server.locks().iter().all(|lock| !lock.held),
        "left held: {:?}",
        server.locks()
    );
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.operation == Operation::Release && r.status == Some(204)),
        "{:?}",
        server.requests()
    );
}

#[tokio::test]
async fn the_clear_text_warning_follows_the_sdks_loopback_rule() {
    let server = MockServer::start().await;
    let port = server.url().rsplit(':').next().unwrap().to_owned();
    // IPv4 loopback written as an IPv6 address, and `localhost.`: loopback,
    // so the flag allows nothing more and nothing is said.
    for host in ["[::ffff:127.0.0.1]", "localhost."] {
        let url = format!("http://{host}:{port}");
        let run = volcano(
            &server,
            &[
                "--api-url",
                &url,
                "--allow-insecure-http",
                "locks",
                "get",
                "k",
            ],
        )
        .await;
        assert!(!run.stderr.contains("clear"), "{url}: {}", run.stderr);
    }
}

/// A pipe whose reading end is already closed: what a command writing to
/// `... | head -1` meets once `head` has exited.
fn closed_pipe() -> Stdio {
    let (sender, receiver) = tokio::net::unix::pipe::pipe().unwrap();
    drop(receiver);
    Stdio::from(sender.into_blocking_fd().unwrap())
}

#[tokio::test]
async fn a_closed_standard_output_ends_a_command_quietly() {
    let server = MockServer::start().await;
    for format in ["text", "json"] {
        let output = Command::new(env!("CARGO_BIN_EXE_volcano"))
            .args(["--output", format, "locks", "get", "k"])
            .env_clear()
            .env("VOLCANO_API_URL", server.url())
            .env("VOLCANO_SERVICE_KEY", server.service_key())
            .stdin(Stdio::null())
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            // Not `output()`: it would capture standard output.
            .spawn()
            .unwrap()
            .wait_with_output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        // A shell's code for a write to a closed pipe, and nothing said.
        assert_eq!(output.status.code(), Some(141), "{stderr}");
        assert!(stderr.is_empty(), "{stderr}");
    }
}

#[tokio::test]
async fn an_applied_acquire_whose_answer_is_unusable_exits_6() {
    use wiremock::matchers::method;
    use wiremock::{Mock, ResponseTemplate};
    let service = wiremock::MockServer::start().await;
    // 201: the lease was granted; the body breaks the contract.
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201).set_body_json(serde_json::json!({"key": 5})))
        .mount(&service)
        .await;
    let output = Command::new(env!("CARGO_BIN_EXE_volcano"))
        .args(["locks", "acquire", "k", "--token", TOKEN])
        .env_clear()
        .env("VOLCANO_API_URL", service.uri())
        .env("VOLCANO_SERVICE_KEY", "key")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(6),
        "may have been applied: run again with the same --token ({stderr})"
    );
}
