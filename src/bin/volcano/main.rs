//! `volcano`: admin CLI for Volcano project locks (feature `cli`).
//!
//! ```sh
//! cargo run --features cli --bin volcano -- locks get daily-report
//! cargo run --features cli --bin volcano -- locks run daily-report -- ./report.sh
//! ```

mod run;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use volcano::{Client, Error, LockLease, LockState};

/// Exit codes, one per error class.
mod exit {
    pub const OTHER: u8 = 1;
    pub const INVALID: u8 = 2;
    pub const CONFLICT: u8 = 3;
    pub const AUTH: u8 = 4;
    pub const RATE_LIMITED: u8 = 5;
    pub const UNAVAILABLE: u8 = 6;
    pub const ABORTED: u8 = 7;
    pub const LOST: u8 = 8;
    pub const MAX_HOLD: u8 = 9;
}

const AFTER_HELP: &str = "\
Exit codes: 0 ok, 1 other error, 2 invalid argument, 3 conflict (lock held or
ownership lost), 4 authentication, 5 rate limited, 6 server or transport error
(outcome unknown), 7 force-release not confirmed, 8 lock lost while `run`'s
command ran. `run` otherwise exits with its command's code (126/127 if the
command cannot be started; 128+N if a signal N ended it).

Credentials come from VOLCANO_SERVICE_KEY, VOLCANO_ANON_KEY and VOLCANO_API_URL;
flags override them.";

/// Inspect and recover Volcano project locks.
#[derive(Debug, Parser)]
#[command(name = "volcano", version, after_help = AFTER_HELP)]
struct Cli {
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// API URL.
    #[arg(long, global = true, env = "VOLCANO_API_URL", default_value = volcano::DEFAULT_API_URL)]
    api_url: String,
    /// Service-role key (prefer the environment variable: flags show up in `ps`).
    #[arg(
        long,
        global = true,
        env = "VOLCANO_SERVICE_KEY",
        hide_env_values = true
    )]
    service_key: Option<String>,
    /// Anon key.
    #[arg(long, global = true, env = "VOLCANO_ANON_KEY", hide_env_values = true)]
    anon_key: Option<String>,
    /// Per-request timeout, e.g. 10s.
    #[arg(long, global = true, value_parser = parse_duration, default_value = "60s")]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lock operations.
    #[command(subcommand)]
    Locks(Locks),
}

#[derive(Debug, Subcommand)]
enum Locks {
    /// Show whether KEY is held, until when, and the holder's fencing token.
    Get {
        key: String,
        #[command(flatten)]
        ids: RequestId,
    },
    /// Acquire KEY.
    ///
    /// To be able to renew or release the lease later, choose the ownership
    /// token yourself (`--token $(uuidgen)`) or ask to see the generated one
    /// (`--show-token`). If acquire fails with exit code 6 the lease may have
    /// been granted anyway: run the same command again with the same --token
    /// and --request-id to recover it.
    Acquire {
        key: String,
        /// Lease duration, whole seconds (5s to 90 days), e.g. 30 or 5m.
        #[arg(long, value_parser = parse_duration, default_value = "30s")]
        ttl: Duration,
        /// Ownership token (a UUID); default: a new one.
        #[arg(long)]
        token: Option<String>,
        /// If the lock is held, keep trying this long, e.g. 30s.
        #[arg(long, value_parser = parse_duration)]
        wait: Option<Duration>,
        /// While waiting, try for an early release this often (default 10s).
        #[arg(long, value_parser = parse_duration, requires = "wait")]
        poll_interval: Option<Duration>,
        /// Print the ownership token (a secret: anyone with it can release the lease).
        #[arg(long)]
        show_token: bool,
        #[command(flatten)]
        ids: RequestId,
    },
    /// Run CMD while holding KEY, renewing it in the background; release
    /// when CMD exits, and exit with CMD's code.
    ///
    /// CMD gets VOLCANO_LOCK_KEY and VOLCANO_FENCING_TOKEN in its
    /// environment, and not VOLCANO_SERVICE_KEY. If the lock is held, exit 3
    /// without starting CMD (unless --wait). If ownership is lost while CMD
    /// runs, CMD gets SIGTERM, then SIGKILL after --kill-after, and the exit
    /// code is 8; when --max-hold ends it, the same, with exit code 9.
    /// Unless the CLI runs in the foreground of a terminal, CMD leads its
    /// own process group and signals reach all of it; SIGTERM, SIGINT,
    /// SIGHUP and SIGQUIT sent to the CLI are passed on (in a terminal's
    /// foreground, what the terminal sends reaches CMD directly and is not
    /// passed on again). With --output json, one object on the last line of
    /// standard output.
    ///
    /// Example (crontab): */5 * * * * volcano locks run nightly-report --ttl 60 -- /opt/report.sh
    Run {
        key: String,
        /// Lease duration, whole seconds; renewed about every third of it.
        #[arg(long, value_parser = parse_duration, default_value = "30s")]
        ttl: Duration,
        /// If the lock is held, wait this long for it, e.g. 10m.
        #[arg(long, value_parser = parse_duration)]
        wait: Option<Duration>,
        /// While waiting, try for an early release this often (default 10s).
        #[arg(long, value_parser = parse_duration, requires = "wait")]
        poll_interval: Option<Duration>,
        /// Hold the lock at most this long: then CMD is stopped as on a
        /// loss, the lock released, and the exit code is 9.
        #[arg(long, value_parser = parse_duration)]
        max_hold: Option<Duration>,
        /// Ownership token (a UUID); default: a new one.
        #[arg(long)]
        token: Option<String>,
        /// After a loss, time between SIGTERM and SIGKILL.
        #[arg(long, value_parser = parse_duration, default_value = "10s")]
        kill_after: Duration,
        #[command(flatten)]
        ids: RequestId,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Renew the lease on KEY owned by --token.
    Renew {
        key: String,
        /// Ownership token of the lease.
        #[arg(long)]
        token: String,
        /// New lease duration from now, whole seconds.
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
        #[command(flatten)]
        ids: RequestId,
    },
    /// Release the lease on KEY owned by --token.
    Release {
        key: String,
        /// Ownership token of the lease.
        #[arg(long)]
        token: String,
        #[command(flatten)]
        ids: RequestId,
    },
    /// Drop whatever lease holds KEY (recovery after a holder died).
    ///
    /// This breaks mutual exclusion: the displaced holder keeps running until
    /// its next renewal fails. Use it only when the protected resource checks
    /// fencing tokens.
    ForceRelease {
        key: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        ids: RequestId,
    },
}

#[derive(Debug, Args)]
struct RequestId {
    /// Request id (a UUID) for correlating with the service's logs.
    #[arg(long)]
    request_id: Option<String>,
}

/// A failure with its exit code.
struct Failure {
    code: u8,
    message: String,
    error: Option<Box<Error>>,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let code = match &error {
            Error::InvalidArgument(_) => exit::INVALID,
            Error::Conflict(_) | Error::LockLost(_) => exit::CONFLICT,
            Error::Authentication(_) => exit::AUTH,
            Error::RateLimited(_) => exit::RATE_LIMITED,
            Error::Server(_) | Error::Transport(_) => exit::UNAVAILABLE,
            _ => exit::OTHER,
        };
        // A transport error's reason (refused, a certificate the trust
        // store does not know, ...) is in its sources.
        let message = std::iter::successors(Some(&error as &dyn std::error::Error), |e| e.source())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(": ");
        Failure {
            code,
            message,
            error: Some(Box::new(error)),
        }
    }
}

fn fail(code: u8, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
        error: None,
    }
}

/// What a command produced: a value to print, or (`run`) a summary with
/// the command's exit code.
enum Done {
    Value(Value),
    Ran(run::Ran),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let output = cli.output;
    match execute(cli).await {
        Ok(Done::Value(value)) => {
            print(output, &value);
            ExitCode::SUCCESS
        }
        Ok(Done::Ran(ran)) => {
            if let Some(warning) = &ran.warning {
                eprintln!("volcano: {warning}");
            }
            if output == Output::Json {
                println!("{}", ran.summary);
            }
            ExitCode::from(ran.code)
        }
        Err(failure) => {
            report(output, &failure);
            ExitCode::from(failure.code)
        }
    }
}

async fn execute(cli: Cli) -> Result<Done, Failure> {
    let mut builder = Client::builder().api_url(&cli.api_url).timeout(cli.timeout);
    match cli.service_key {
        Some(key) => builder = builder.service_key(key),
        None => {
            return Err(fail(
                exit::INVALID,
                "no service key: set VOLCANO_SERVICE_KEY or pass --service-key",
            ))
        }
    }
    // An empty variable counts as unset, as in `Client::from_env`.
    if let Some(key) = cli.anon_key.filter(|k| !k.is_empty()) {
        builder = builder.anon_key(key);
    }
    let client = builder.build()?;
    let locks = client.locks();
    let Command::Locks(command) = cli.command;
    if let Locks::Run {
        key,
        ttl,
        wait,
        poll_interval,
        max_hold,
        token,
        kill_after,
        ids,
        command,
    } = command
    {
        let args = run::RunArgs {
            key,
            ttl,
            wait,
            poll_interval,
            max_hold,
            token,
            request_id: ids.request_id,
            kill_after,
            command,
        };
        let ran = run::run(&locks, args).await;
        // Anything handed to the background (a release that keeps failing)
        // gets a few seconds before the process exits; a lease that may
        // still be held is said, on standard error.
        let unreleased = client.shutdown(Duration::from_secs(5)).await;
        if !unreleased.is_empty() {
            eprintln!(
                "volcano: warning: {} may still be held until its ttl (the release did not finish)",
                unreleased.join(", ")
            );
        }
        return ran.map(Done::Ran);
    }
    command_value(&locks, command).await.map(Done::Value)
}

async fn command_value(locks: &volcano::Locks, command: Locks) -> Result<Value, Failure> {
    match command {
        Locks::Get { key, ids } => {
            let mut get = locks.get(&key);
            if let Some(id) = ids.request_id {
                get = get.request_id(id);
            }
            Ok(state_json(&key, &get.await?))
        }
        Locks::Acquire {
            key,
            ttl,
            token,
            wait,
            poll_interval,
            show_token,
            ids,
        } => {
            let chosen = token.is_some();
            let mut acquire = locks.acquire(&key, ttl);
            if let Some(token) = token {
                acquire = acquire.token(token);
            }
            if let Some(id) = ids.request_id {
                acquire = acquire.request_id(id);
            }
            if let Some(wait) = wait {
                acquire = acquire.wait(wait);
            }
            if let Some(poll) = poll_interval {
                acquire = acquire.poll_interval(poll);
            }
            let lease = acquire.await?;
            let mut value = lease_json(&lease, show_token);
            if !show_token && !chosen {
                value["note"] = "the generated ownership token is not shown; \
                    use --token or --show-token to be able to renew or release"
                    .into();
            }
            Ok(value)
        }
        Locks::Renew {
            key,
            token,
            ttl,
            ids,
        } => {
            let lease = lease_of(&key, token);
            let mut renew = locks.renew(&lease, ttl);
            if let Some(id) = ids.request_id {
                renew = renew.request_id(id);
            }
            Ok(lease_json(&renew.await?, false))
        }
        Locks::Release { key, token, ids } => {
            let lease = lease_of(&key, token);
            let mut release = locks.release(&lease);
            if let Some(id) = ids.request_id {
                release = release.request_id(id);
            }
            release.await?;
            Ok(json!({ "key": key, "released": true }))
        }
        Locks::ForceRelease { key, yes, ids } => {
            // Shown when someone may read it: always when asking, and with
            // --yes only on a terminal (not in every cron mail).
            if !yes || std::io::stderr().is_terminal() {
                eprintln!(
                    "warning: force-release breaks mutual exclusion: the current holder of {key:?} keeps \
                     running until its next renewal fails. It is safe only if the protected resource \
                     checks fencing tokens."
                );
            }
            if !yes && !std::io::stdin().is_terminal() {
                return Err(fail(
                    exit::ABORTED,
                    "not confirmed: standard input is not a terminal; pass --yes to force-release",
                ));
            }
            // What was there, to report and to show before confirming. With
            // --yes a failed look does not block the recovery.
            let before = match locks.get(&key).await {
                Ok(state) => Some(state),
                Err(err) if yes => {
                    eprintln!("volcano: could not read the lock first ({err}); releasing anyway");
                    None
                }
                Err(err) => return Err(err.into()),
            };
            if let (false, Some(seen)) = (yes, &before) {
                confirm(&key, seen)?;
                // The lock may have changed hands while the user typed.
                let now = locks.get(&key).await?;
                if (now.held(), now.fencing_token()) != (seen.held(), seen.fencing_token()) {
                    return Err(fail(
                        exit::ABORTED,
                        "not confirmed: the lock changed while confirming; nothing was released",
                    ));
                }
            }
            let mut force = locks.force_release(&key);
            if let Some(id) = ids.request_id {
                force = force.request_id(id);
            }
            force.await?;
            Ok(json!({
                "key": key,
                "force_released": true,
                "was_held": before.as_ref().map(LockState::held),
                "fencing_token": before.as_ref().and_then(LockState::fencing_token),
            }))
        }
        Locks::Run { .. } => unreachable!("run is handled by execute"),
    }
}

/// Asks on a terminal for the key to be typed back.
fn confirm(key: &str, state: &LockState) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    match state.fencing_token().filter(|_| state.held()) {
        Some(fence) => eprintln!("{key} is held (fencing token {fence})."),
        None => eprintln!("{key} is free."),
    }
    eprint!("Type the key ({key}) to force-release it: ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| fail(exit::ABORTED, format!("no confirmation: {e}")))?;
    if answer.trim() == key {
        Ok(())
    } else {
        Err(fail(exit::ABORTED, "not confirmed; nothing was released"))
    }
}

/// A lease named by its key and ownership token, for renew and release
/// (the service needs nothing else; expiry and fence are placeholders).
fn lease_of(key: &str, token: impl Into<String>) -> LockLease {
    LockLease::new(key, token, chrono::Utc::now(), 0)
}

fn state_json(key: &str, state: &LockState) -> Value {
    json!({
        "key": key,
        "held": state.held(),
        "expires_at": state.expires_at().map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        "fencing_token": state.fencing_token(),
    })
}

fn lease_json(lease: &LockLease, show_token: bool) -> Value {
    let mut value = json!({
        "key": lease.key(),
        "held": true,
        "expires_at": lease.expires_at().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "fencing_token": lease.fencing_token(),
    });
    if show_token {
        value["token"] = lease.token().into();
    }
    value
}

fn print(output: Output, value: &Value) {
    if output == Output::Json {
        println!("{value}");
        return;
    }
    let key = value["key"].as_str().unwrap_or_default();
    if value.get("released").is_some() {
        println!("released {key}");
    } else if value.get("force_released").is_some() {
        match value["was_held"].as_bool() {
            Some(true) => println!(
                "force-released {key} (held when checked, fencing token {})",
                value["fencing_token"]
            ),
            Some(false) => println!("{key} was free when checked; force-released anyway"),
            None => println!("force-released {key}"),
        }
    } else if value["held"] == true {
        println!(
            "{key}: held until {} (fencing token {})",
            value["expires_at"].as_str().unwrap_or("?"),
            value["fencing_token"]
        );
        if let Some(token) = value.get("token").and_then(Value::as_str) {
            println!("token: {token}");
        }
        if let Some(note) = value.get("note").and_then(Value::as_str) {
            eprintln!("note: {note}");
        }
    } else {
        println!("{key}: free");
    }
}

fn report(output: Output, failure: &Failure) {
    let error = failure.error.as_deref();
    let status = error.and_then(Error::status);
    let code = error.and_then(Error::code);
    let request_id = error.and_then(Error::request_id);
    let retry_after = error.and_then(Error::retry_after).map(|d| d.as_secs());
    if output == Output::Json {
        let value = json!({
            "error": failure.message,
            "exit_code": failure.code,
            "status": status,
            "code": code,
            "request_id": request_id,
            "retry_after_secs": retry_after,
        });
        eprintln!("{value}");
        return;
    }
    // Status and code once: API errors already say them in the message.
    let mut details = Vec::new();
    if let Some(status) = status.filter(|s| !failure.message.contains(&format!("HTTP {s}"))) {
        details.push(format!("status {status}"));
    }
    if let Some(code) = code.filter(|c| !failure.message.contains(c)) {
        details.push(format!("code {code}"));
    }
    if let Some(id) = request_id {
        details.push(format!("request id {id}"));
    }
    if let Some(secs) = retry_after {
        details.push(format!("retry after {secs}s"));
    }
    if details.is_empty() {
        eprintln!("volcano: {}", failure.message);
    } else {
        eprintln!("volcano: {} [{}]", failure.message, details.join(", "));
    }
}

/// `500ms`, `10s`, `5m`, `2h`, `90d`, or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s, 500ms, 5m"))?;
    let per_unit = match unit {
        "" | "s" => Duration::from_secs(1),
        "ms" => Duration::from_millis(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3_600),
        "d" => Duration::from_secs(86_400),
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m, h or d)"
            ))
        }
    };
    per_unit
        .checked_mul(u32::try_from(n).map_err(|_| format!("{text:?} is too long"))?)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(7_776_000)));
        for bad in ["", "s", "-5", "1.5s", "10 parsecs", "99999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
