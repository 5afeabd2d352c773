//! The commands that inspect or change a lock with a request or two: get,
//! acquire, renew, release and force-release. Each returns the value
//! `output::print` shows.

use std::io::{BufRead, IsTerminal};
use std::time::Duration;

use serde_json::{json, Value};
use volcano::{AcquireOptions, LockState, Locks};

use crate::args::LockCommand;
use crate::exit::{self, fail, Failure};
use crate::output::{lease_json, say, say_raw, state_json, warn};
use crate::run::lease_of;

/// Runs any command but `run`.
pub(crate) async fn execute(locks: &Locks, command: LockCommand) -> Result<Value, Failure> {
    match command {
        LockCommand::Get { key, ids } => get(locks, &key, ids.request_id).await,
        LockCommand::Status {
            name,
            permits: None,
        } => get(locks, &name, None).await,
        LockCommand::Status {
            name,
            permits: Some(permits),
        } => status(locks, &name, permits).await,
        LockCommand::Acquire {
            key,
            ttl,
            token,
            wait,
            poll_interval,
            show_token,
            ids,
        } => {
            let options = AcquireOptions::default()
                .set_token(token)
                .set_request_id(ids.request_id)
                .set_wait(wait)
                .set_poll_interval(poll_interval);
            acquire(locks, &key, ttl, options, show_token).await
        }
        LockCommand::Renew {
            key,
            token,
            ttl,
            ids,
        } => renew(locks, &key, token, ttl, ids.request_id).await,
        LockCommand::Release { key, token, ids } => {
            release(locks, key, token, ids.request_id).await
        }
        LockCommand::ForceRelease {
            key,
            yes,
            if_fencing_token,
            ids,
        } => force_release(locks, key, yes, if_fencing_token, ids.request_id).await,
        LockCommand::Diagnose { key, interval } => {
            if interval < Duration::from_millis(100) {
                return Err(fail(exit::INVALID, "--interval must be at least 100ms"));
            }
            crate::diagnose::diagnose(locks, &key, interval).await
        }
        LockCommand::Run { .. } | LockCommand::Watch { .. } => {
            unreachable!("run and watch are handled by main's execute")
        }
    }
}

async fn get(locks: &Locks, key: &str, request_id: Option<String>) -> Result<Value, Failure> {
    let state = locks.get(key).set_request_id(request_id).await?;
    Ok(state_json(key, &state))
}

/// Each permit of the semaphore `name` of `permits`, one `get` each.
async fn status(locks: &Locks, name: &str, permits: u32) -> Result<Value, Failure> {
    if permits == 0 || permits > volcano::MAX_PERMITS {
        return Err(crate::exit::fail(
            crate::exit::INVALID,
            format!(
                "--permits must be 1 to {} (got {permits})",
                volcano::MAX_PERMITS
            ),
        ));
    }
    let semaphore = locks.semaphore(name, permits);
    // Every permit's key checked before the first request.
    semaphore.check()?;
    let mut states = Vec::new();
    let mut held = 0;
    for i in 0..permits {
        let key = semaphore.permit_key(i);
        let state = locks.get(&key).await?;
        held += u32::from(state.held());
        states.push(state_json(&key, &state));
    }
    Ok(serde_json::json!({
        "semaphore": name,
        "permits": permits,
        "permits_held": held,
        "permit_states": states,
    }))
}

async fn acquire(
    locks: &Locks,
    key: &str,
    ttl: Duration,
    options: AcquireOptions,
    show_token: bool,
) -> Result<Value, Failure> {
    let chosen = options.get_token().is_some();
    let waiting = options.get_wait().is_some();
    let acquiring = locks.acquire(key, ttl).options(options).send();
    let lease = crate::status::while_waiting(locks, key, waiting, acquiring).await?;
    let mut value = lease_json(&lease, show_token);
    if !show_token && !chosen {
        value["note"] = "the generated ownership token is not shown; \
            use --token or --show-token to be able to renew or release"
            .into();
    }
    Ok(value)
}

async fn renew(
    locks: &Locks,
    key: &str,
    token: String,
    ttl: Duration,
    request_id: Option<String>,
) -> Result<Value, Failure> {
    let lease = lease_of(key, token);
    let renewed = locks.renew(&lease, ttl).set_request_id(request_id).await?;
    Ok(lease_json(&renewed, false))
}

async fn release(
    locks: &Locks,
    key: String,
    token: String,
    request_id: Option<String>,
) -> Result<Value, Failure> {
    // The service answers 204 also when no lease is there: look first, so
    // that a lease already gone (expired, force-released) is said. A look
    // that fails does not stop the release.
    let before = locks.get(&key).await.ok().map(|state| state.held());
    let lease = lease_of(&key, token);
    locks.release(&lease).set_request_id(request_id).await?;
    Ok(match before {
        Some(false) => json!({ "key": key, "released": false, "was_held": false }),
        Some(true) => json!({ "key": key, "released": true }),
        None => json!({ "key": key, "released": true, "was_held": null }),
    })
}

/// Warns, looks at the lock, asks for the key to be typed back unless
/// `--yes`, and drops whatever lease holds it: with `expected`, only the
/// lease of that fencing token.
async fn force_release(
    locks: &Locks,
    key: String,
    yes: bool,
    expected: Option<i64>,
    request_id: Option<String>,
) -> Result<Value, Failure> {
    warn_before_forcing(&key, yes)?;
    // With a token to check, a failed look releases nothing: exit 7.
    let before = match (
        expected,
        look_before(locks, &key, yes && expected.is_none()).await,
    ) {
        (Some(_), Err(failure)) => {
            return Err(fail(
                exit::ABORTED,
                format!(
                    "could not read {key} to check its fencing token ({}); nothing was released",
                    failure.message
                ),
            ))
        }
        (_, looked) => looked?,
    };
    if let (Some(expected), Some(seen)) = (expected, &before) {
        check_fence(&key, seen, expected)?;
    }
    if let (false, Some(seen)) = (yes, &before) {
        confirm_unchanged(locks, &key, seen).await?;
    }
    locks.force_release(&key).set_request_id(request_id).await?;
    Ok(json!({
        "key": key,
        "force_released": true,
        "was_held": before.as_ref().map(LockState::held),
        "fencing_token": before.as_ref().and_then(LockState::fencing_token),
    }))
}

/// The warning, shown when someone may read it: always when asking, and
/// with --yes only on a terminal (not in every cron mail). Without --yes,
/// standard input must be a terminal to ask on.
fn warn_before_forcing(key: &str, yes: bool) -> Result<(), Failure> {
    if !yes || std::io::stderr().is_terminal() {
        say(format_args!(
            "warning: force-release breaks mutual exclusion: the current holder of {key:?} keeps \
             running until its next renewal fails. It is safe only if the protected resource \
             checks fencing tokens."
        ));
    }
    if !yes && !std::io::stdin().is_terminal() {
        return Err(fail(
            exit::ABORTED,
            "not confirmed: standard input is not a terminal; pass --yes to force-release",
        ));
    }
    Ok(())
}

/// `--if-fencing-token`: the lease seen must be the one named.
fn check_fence(key: &str, seen: &LockState, expected: i64) -> Result<(), Failure> {
    match seen.fencing_token().filter(|_| seen.held()) {
        Some(fence) if fence == expected => Ok(()),
        Some(fence) => Err(fail(
            exit::ABORTED,
            format!(
                "{key} is held by fencing token {fence}, not {expected}: another holder took it \
                 since; nothing was released"
            ),
        )),
        None => Err(fail(
            exit::ABORTED,
            format!(
                "{key} is free (fencing token {expected} no longer holds it); nothing was released"
            ),
        )),
    }
}

/// What was there, to report and to show before confirming. With --yes a
/// failed look does not block the recovery.
async fn look_before(locks: &Locks, key: &str, yes: bool) -> Result<Option<LockState>, Failure> {
    match locks.get(key).await {
        Ok(state) => Ok(Some(state)),
        Err(err) if yes => {
            warn(format_args!(
                "could not read the lock first ({err}); releasing anyway"
            ));
            Ok(None)
        }
        Err(err) => Err(err.into()),
    }
}

/// Asks for the key, then checks that the lock has not changed hands while
/// the user typed.
async fn confirm_unchanged(locks: &Locks, key: &str, seen: &LockState) -> Result<(), Failure> {
    confirm(key, seen)?;
    let now = locks.get(key).await?;
    if (now.held(), now.fencing_token()) != (seen.held(), seen.fencing_token()) {
        return Err(fail(
            exit::ABORTED,
            "not confirmed: the lock changed while confirming; nothing was released",
        ));
    }
    Ok(())
}

/// Asks on a terminal for the key to be typed back.
fn confirm(key: &str, state: &LockState) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    match state.fencing_token().filter(|_| state.held()) {
        Some(fence) => say(format_args!("{key} is held (fencing token {fence}).")),
        None => say(format_args!("{key} is free.")),
    };
    say_raw(format_args!("Type the key ({key}) to force-release it: "));
    crate::stderr::drain(std::time::Duration::from_secs(2));
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
