//! The command line: flags, subcommands and their help text (clap), and
//! the duration syntax the flags take.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The heading of the options every command takes, listed apart from each
/// command's own.
const GLOBAL: &str = "Global options";

/// Inspect and recover Volcano project locks.
//
// No `Debug` here or on the commands: they hold the service key and an
// ownership token.
#[derive(Parser)]
#[command(name = "volcano", version, after_help = crate::exit::after_help())]
pub(crate) struct Cli {
    /// Output format.
    #[arg(long, global = true, help_heading = GLOBAL, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    /// API URL.
    #[arg(long, global = true, help_heading = GLOBAL, env = "VOLCANO_API_URL", default_value = volcano::DEFAULT_API_URL)]
    pub(crate) api_url: String,
    /// Service-role key (prefer the environment variable: flags show up in `ps`).
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "VOLCANO_SERVICE_KEY",
        hide_env_values = true
    )]
    pub(crate) service_key: Option<String>,
    /// Anon key.
    #[arg(long, global = true, help_heading = GLOBAL, env = "VOLCANO_ANON_KEY", hide_env_values = true)]
    pub(crate) anon_key: Option<String>,
    /// Per-request timeout, e.g. 10s.
    #[arg(long, global = true, help_heading = GLOBAL, value_parser = parse_duration, default_value = "60s")]
    pub(crate) timeout: Duration,
    /// Allow a plain http:// API URL off loopback (a mock server in
    /// docker-compose, say). The service key then crosses the network in
    /// clear text, and any HTTP proxy sees it.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "VOLCANO_ALLOW_INSECURE_HTTP",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub(crate) allow_insecure_http: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    Text,
    Json,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Lock operations.
    #[command(subcommand)]
    Locks(LockCommand),
}

// The `locks` subcommands (a plain comment: doc comments on clap types become help text).
#[derive(Subcommand)]
pub(crate) enum LockCommand {
    /// Show whether KEY is held, until when, and the holder's fencing token.
    Get {
        /// The lock key: 1 to 128 letters, digits, '.', '_', ':' or '-',
        /// starting with a letter or digit.
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
        /// The lock key: 1 to 128 letters, digits, '.', '_', ':' or '-',
        /// starting with a letter or digit.
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
    /// (or --held-exit-code) without starting CMD (unless --wait). If ownership is lost while CMD
    /// runs, CMD gets SIGTERM, then SIGKILL after --kill-after, and the exit
    /// code is 8; when --max-hold ends it, the same, with exit code 9.
    /// Unless the CLI runs in the foreground of a terminal, CMD leads its
    /// own process group and signals reach all of it; SIGTERM, SIGINT,
    /// SIGHUP and SIGQUIT sent to the CLI are passed on (in a terminal's
    /// foreground, what the terminal sends reaches CMD directly and is not
    /// passed on again). With --output json, one object on the last line of
    /// standard output.
    ///
    /// Example (crontab on several hosts, once per 5 minutes: --min-hold
    /// keeps the key 60 s after it was acquired, so a host whose clock is a
    /// few seconds late skips too; a host that finds the lock held skips
    /// quietly):
    ///
    ///   */5 * * * * volcano locks run nightly-report --ttl 60 --min-hold 60s --held-exit-code 0 --quiet -- /opt/report.sh
    Run {
        /// The lock key: 1 to 128 letters, digits, '.', '_', ':' or '-',
        /// starting with a letter or digit. With --permits, the
        /// semaphore's name.
        key: String,
        /// Run under one permit of the semaphore KEY of N permits (1 to
        /// 100: the locks KEY:0 to KEY:N-1) instead of the lock KEY: at
        /// most N such commands run at once. Exit codes as for a lock (3:
        /// every permit held).
        #[arg(long, value_name = "N")]
        permits: Option<u32>,
        /// Exit with this code instead of 3 when the lock is held elsewhere
        /// (0 makes a skip a success: cron mails nothing), printing one line
        /// at most. Codes 1 to 10 are also the CLI's own; 0 or one above
        /// them (75, EX_TEMPFAIL, say) keeps a skip apart.
        #[arg(long, value_name = "N")]
        held_exit_code: Option<u8>,
        /// When the lock is held elsewhere, print nothing at all.
        #[arg(long)]
        quiet: bool,
        /// Lease duration, whole seconds; renewed at about half of it (a third for short ones).
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
        /// Keep the key at least this long after it was acquired, however
        /// soon CMD exits (for cron jobs on several hosts: a host whose
        /// schedule fires a little later finds it held and skips). Kept by
        /// the service: when CMD exits one renewal sets the lease's expiry
        /// to the minimum's end (at least 5 s) and the CLI exits at once.
        /// At most 90 days and at most --max-hold.
        #[arg(long, value_parser = parse_duration)]
        min_hold: Option<Duration>,
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
        /// The lock key: 1 to 128 letters, digits, '.', '_', ':' or '-',
        /// starting with a letter or digit.
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
        /// The lock key: 1 to 128 letters, digits, '.', '_', ':' or '-',
        /// starting with a letter or digit.
        key: String,
        /// Ownership token of the lease.
        #[arg(long)]
        token: String,
        #[command(flatten)]
        ids: RequestId,
    },
    /// Print a line each time a key changes (acquired, renewed, taken_over,
    /// released, expired, or ended) until interrupted; JSON lines with
    /// --output json.
    ///
    /// "taken_over": held under a new fencing token with no free state seen
    /// between. "released": freed before its expiry, by its holder or
    /// force-released. "ended": freed, and the answers cannot tell a release
    /// from an expiry (last seen before its final second, seen free only
    /// once it had begun). One request every --interval, the keys in turn
    /// (the default, 2s, is 30 requests a minute: 5% of a 600/min project
    /// quota); a 429 slows it down.
    Watch {
        /// The lock keys to watch.
        #[arg(required = true, value_name = "KEY")]
        keys: Vec<String>,
        /// Time between two requests (at least 100ms).
        #[arg(long, value_parser = parse_duration, default_value = "2s")]
        interval: Duration,
    },
    /// Show a semaphore's permits: with --permits N, each of NAME:0 to
    /// NAME:N-1 (held, until when, fencing token) and how many are held;
    /// without, KEY as `get` shows it.
    Status {
        /// The lock key, or the semaphore's name with --permits.
        #[arg(value_name = "NAME")]
        name: String,
        /// NAME is a semaphore of this many permits (1 to 100): one request
        /// per permit.
        #[arg(long, value_name = "N")]
        permits: Option<u32>,
    },
    /// Is anyone still renewing KEY? Watch it until one of: free (not held
    /// at the first look), renewed (its expiry moved: a live holder),
    /// released (freed before its expiry), expired (ran out unrenewed) or
    /// unrenewed (still held, not renewed for 70 s: the longest a holder
    /// using this SDK or the CLI leaves between renewals, 66 s, and 4 s for
    /// the renewal's own trip).
    ///
    /// Never watches longer than those 70 s (less when the lease expires
    /// sooner), by this machine's clock or the service's. Exit 0 for every
    /// verdict; with --output json, one object with "verdict". One request
    /// every --interval (2s: at most 36, about 6% of a 600/min quota); a 429
    /// or a transient failure is waited out (exit 6 if it lasts to the end).
    ///
    /// To find the holder, look for its fencing token in your logs: `locks
    /// run` (at INFO unless --quiet), `with_lock` and `hold` log "lock
    /// acquired" with key, fencing_token, host and pid.
    Diagnose {
        /// The lock key: 1 to 128 letters, digits, '.', '_', ':' or '-',
        /// starting with a letter or digit.
        key: String,
        /// Time between two looks (at least 100ms).
        #[arg(long, value_parser = parse_duration, default_value = "2s")]
        interval: Duration,
    },
    /// Drop whatever lease holds KEY (recovery after a holder died).
    ///
    /// This breaks mutual exclusion: the displaced holder keeps running until
    /// its next renewal fails. Use it only when the protected resource checks
    /// fencing tokens.
    ///
    /// With --if-fencing-token N only the lease you looked at is dropped:
    /// the lock is read first, and if its fencing token is not N (another
    /// holder took it since, or it is free) nothing is released and the exit
    /// code is 7. The check and the release are two requests: a lease that
    /// changes hands in the milliseconds between them is still dropped.
    ForceRelease {
        /// The lock key: 1 to 128 letters, digits, '.', '_', ':' or '-',
        /// starting with a letter or digit.
        key: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// Release only if the lock's fencing token is N now (from `locks
        /// get` or `locks diagnose`); else exit 7 and release nothing.
        #[arg(long, value_name = "N")]
        if_fencing_token: Option<i64>,
        #[command(flatten)]
        ids: RequestId,
    },
}

#[derive(Args)]
pub(crate) struct RequestId {
    /// Request id (a UUID) for correlating with the service's logs.
    #[arg(long)]
    pub(crate) request_id: Option<String>,
}

/// `500ms`, `10s`, `1.5s`, `5m`, `2h`, `90d`, or a bare number of seconds
/// (decimals allowed, to the millisecond).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let like = || format!("{text:?} is not a duration like 30s, 1.5s, 500ms or 5m");
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') || fraction.len() > 9 {
        return Err(like());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| like())?
    };
    let fraction_value: u64 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| like())?
    };
    let per_unit_ms: u64 = match unit {
        "" | "s" => 1_000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m, h or d; decimals like 1.5s are fine)"
            ))
        }
    };
    // The fraction of a unit, in milliseconds: it must come out whole.
    let scale = 10_u64.pow(fraction.len() as u32);
    let fraction_ms = fraction_value * per_unit_ms;
    if fraction_ms % scale != 0 {
        return Err(format!("{text:?} is finer than a millisecond"));
    }
    let milli_fraction = fraction_ms / scale;
    let too_long = || format!("{text:?} is too long");
    let ms = whole
        .checked_mul(per_unit_ms)
        .and_then(|ms| ms.checked_add(milli_fraction))
        .ok_or_else(too_long)?;
    if ms > 400 * 86_400_000 {
        return Err(too_long());
    }
    Ok(Duration::from_millis(ms))
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
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("0.5m"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration(".25s"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2.000s"), Ok(Duration::from_secs(2)));
        for bad in [
            "",
            "s",
            ".",
            "-5",
            "1.2.3s",
            "1.5ms",
            "1.0001s",
            "10 parsecs",
            "99999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("5x")
            .unwrap_err()
            .contains("use ms, s, m, h or d"));
    }
}
