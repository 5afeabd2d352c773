//! `volcano`: admin CLI for Volcano project locks (feature `cli`).
//!
//! ```sh
//! cargo run -p volcano --features cli --bin volcano -- locks get daily-report
//! cargo run -p volcano --features cli --bin volcano -- locks run daily-report -- ./report.sh
//! ```
//!
//! This file only wires the parts together: `args` (flags and help text),
//! `admin` (get, status, acquire, renew, release, force-release and
//! diagnose's entry), `diagnose` (is anyone renewing a key?), `watch`,
//! `run` and `child` (`locks run` and its child process), `status` (the
//! line shown while waiting), `output` (what is printed), `log` (the SDK's
//! log lines on standard error) and `exit` (exit codes and the failure
//! that carries one).
//!
//! Nothing here prints with `println!` or `eprintln!`: they panic when the
//! output is gone, and a CLI that supervises a lock must outlive its
//! readers. Every write goes through `output` (the lints below hold it).
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod admin;
mod args;
mod child;
mod diagnose;
mod exit;
mod log;
mod output;
mod run;
mod status;
mod stderr;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;
use serde_json::Value;
use volcano::Client;

use crate::args::{Cli, Command, LockCommand};
use crate::exit::{fail, Failure};
use crate::run::{Ran, RunArgs};

/// What a command produced: a value to print, or (`run`) a summary with
/// the command's exit code.
enum Done {
    Value(Value),
    Ran(Ran),
    /// `watch` printed as it went and was interrupted.
    Watched,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage(err),
    };
    let format = cli.output;
    stderr::install(format);
    // `locks run` says at INFO which host and process took the lock (an
    // operator finds a holder by its fencing token); --quiet leaves that
    // out. Everything else: warnings and errors.
    let level = match &cli.command {
        Command::Locks(LockCommand::Run { quiet: false, .. }) => "warn,volcano=info",
        Command::Locks(_) => "warn",
    };
    log::install(format, level);
    let code = match execute(cli).await {
        Ok(Done::Value(value)) => {
            if output::print(format, &value) {
                ExitCode::from(exit::OK)
            } else {
                // Nothing more is printed.
                ExitCode::from(exit::CLOSED_OUTPUT)
            }
        }
        Ok(Done::Watched) => ExitCode::from(exit::OK),
        Ok(Done::Ran(ran)) => {
            output::ended(format, &ran);
            ExitCode::from(ran.code)
        }
        Err(failure) => {
            output::report(format, &failure);
            ExitCode::from(failure.code)
        }
    };
    // What is queued for standard error, unless its reader stalled.
    stderr::drain(Duration::from_secs(2));
    code
}

async fn execute(cli: Cli) -> Result<Done, Failure> {
    let Cli {
        output,
        api_url,
        service_key,
        anon_key,
        timeout,
        allow_insecure_http,
        command: Command::Locks(command),
    } = cli;
    let client = connect(
        &api_url,
        timeout,
        service_key,
        anon_key,
        allow_insecure_http,
    )?;
    let locks = client.locks();
    match command {
        LockCommand::Run {
            key,
            permits,
            held_exit_code,
            quiet,
            ttl,
            wait,
            poll_interval,
            max_hold,
            min_hold,
            token,
            kill_after,
            ids,
            command,
        } => {
            let options = volcano::AcquireOptions::default()
                .set_token(token)
                .set_request_id(ids.request_id)
                .set_wait(wait)
                .set_poll_interval(poll_interval)
                .set_max_hold(max_hold);
            let args = RunArgs {
                key,
                permits,
                ttl,
                options,
                held: run::WhenHeld {
                    exit_code: held_exit_code,
                    quiet,
                },
                min_hold,
                kill_after,
                command,
            };
            let ran = run::run(&locks, args).await;
            shut_down(&client).await;
            ran.map(Done::Ran)
        }
        LockCommand::Watch { keys, interval } => watch::watch(&locks, keys, interval, output)
            .await
            .map(|()| Done::Watched),
        command => {
            // A signal drops the request: an acquire of unknown outcome
            // under a generated token is then undone by the SDK, in the
            // background, which the shutdown below waits for.
            let mut signals = child::Signals::install()?;
            let done = tokio::select! {
                done = admin::execute(&locks, command) => done.map(Done::Value),
                stop = signals.next() => Err(fail(
                    stop.shell_code(),
                    format!("{stop:?} received; the request was abandoned"),
                )),
            };
            shut_down(&client).await;
            done
        }
    }
}

/// clap's message for a bad command line (exit 2; help and version exit
/// 0), with a hint when an argument that starts with `-` was taken for an
/// unknown flag: a key cannot start with `-`, and a value that does goes
/// after `--`.
fn usage(err: clap::Error) -> ExitCode {
    let code = u8::try_from(err.exit_code()).unwrap_or(exit::INVALID);
    let asked = matches!(
        err.kind(),
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
    );
    if !asked && json_asked() {
        // The documented error object, as for any other failure: clap's
        // message without its `error: ` and its closing tip (a missing
        // command, whose message is the whole help, in a line).
        let message =
            if err.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                "a command is required: volcano locks <COMMAND> (see volcano --help)".to_owned()
            } else {
                let text = err.render().to_string();
                let lines: Vec<&str> = text
                    .lines()
                    .map(str::trim_end)
                    .filter(|line| !line.is_empty() && !line.starts_with("For more information"))
                    .collect();
                let message = lines.join(" ");
                message
                    .strip_prefix("error: ")
                    .unwrap_or(&message)
                    .to_owned()
            };
        stderr::install(args::Output::Json);
        output::report(args::Output::Json, &fail(code, message));
        stderr::drain(Duration::from_secs(2));
        return ExitCode::from(code);
    }
    // Only a single-dash word (`-lock`), not a misspelt `--flag`.
    let dashed_word = matches!(
        err.get(clap::error::ContextKind::InvalidArg),
        Some(clap::error::ContextValue::String(arg)) if !arg.starts_with("--")
    );
    let unknown = err.kind() == clap::error::ErrorKind::UnknownArgument && dashed_word;
    let _ = err.print();
    if unknown {
        output::say(
            "\nnote: lock keys start with a letter or digit, so a KEY cannot start with '-'; \
             to pass any other value that starts with '-', put it after `--`",
        );
        stderr::drain(Duration::from_secs(2));
    }
    ExitCode::from(code)
}

/// Whether the command line asks for `--output json` (read by hand: clap
/// could not parse it), before any `--` (a command's own arguments).
fn json_asked() -> bool {
    let args: Vec<_> = std::env::args_os()
        .skip(1)
        .take_while(|arg| arg != "--")
        .collect();
    args.iter().any(|arg| arg == "--output=json")
        || args
            .windows(2)
            .any(|pair| pair[0] == "--output" && pair[1] == "json")
}

/// The client, from the flags and the environment. Without a service key
/// nothing is sent: exit 2.
fn connect(
    api_url: &str,
    timeout: Duration,
    service_key: Option<String>,
    anon_key: Option<String>,
    allow_insecure_http: bool,
) -> Result<Client, Failure> {
    let mut builder = Client::builder()
        .api_url(api_url)
        .timeout(timeout)
        .allow_insecure_http(allow_insecure_http);
    if timeout.is_zero() {
        return Err(fail(exit::INVALID, "--timeout must be above 0"));
    }
    match service_key {
        Some(key) => builder = builder.service_key(key),
        None => {
            return Err(fail(
                exit::INVALID,
                "no service key: set VOLCANO_SERVICE_KEY or pass --service-key",
            ))
        }
    }
    // An empty variable counts as unset, as in `Client::from_env`.
    if let Some(key) = anon_key.filter(|k| !k.is_empty()) {
        builder = builder.anon_key(key);
    }
    let client = builder.build().map_err(Failure::from)?;
    // Only once the URL was accepted: a refused one sends nothing. The
    // SDK decides what is loopback, as it did to accept the URL.
    if client.sends_key_in_clear() {
        output::warn(format_args!(
            "--allow-insecure-http: the service key goes to {} in clear text (and through any \
             HTTP proxy)",
            origin(client.api_url())
        ));
    }
    Ok(client)
}

/// `http://host:port` of `api_url`, nothing else of the URL (no path).
fn origin(api_url: &str) -> String {
    match reqwest::Url::parse(api_url) {
        Ok(url) => url.origin().ascii_serialization(),
        Err(_) => api_url.to_owned(),
    }
}

/// The client's shutdown, after any command that sent requests: anything
/// handed to the background (a release that keeps failing, the undo of an
/// acquire whose outcome is unknown) gets a few seconds before the process
/// exits; a lease that may still be held is said, on standard error.
/// It waits for an undo to see the window of a late try close (a request
/// timeout and the margin after the try's outcome became unknown), but
/// never more than 15 s: a process told to stop should stop. A key whose
/// window is still open then is named.
async fn shut_down(client: &Client) {
    let window = client.timeout() + volcano::LATE_TRY_MARGIN + Duration::from_secs(5);
    let unreleased = client.shutdown(window.min(Duration::from_secs(15))).await;
    if !unreleased.is_empty() {
        output::warn(format_args!(
            "{} may still be held until its ttl (a release did not finish, or a try of the \
             acquire may still land within --timeout and 2 s)",
            unreleased.join(", ")
        ));
    }
}
