//! Getting the lock for `run` (a signal ends the wait), and, after an
//! acquire with the caller's `--token` failed or was abandoned, releasing
//! what it may have obtained.

use volcano::{Error, HeldLock, LockLease, Locks};

use super::{lease_of, RunArgs};
use crate::child::Signals;
use crate::exit::{fail, Failure};
use crate::output::warn;

/// Acquires the lock. A signal while waiting for it ends the wait. A lease
/// the dropped or failed acquire may have obtained is released: by the
/// client for a generated token, here for the caller's.
pub(super) async fn acquire(
    locks: &Locks,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<HeldLock, Failure> {
    let token = args.options.get_token();
    // `--min-hold` is checked by the SDK, as for `min_hold`, before
    // anything is sent; the release then keeps it.
    let waiting = args.options.get_wait().is_some();
    let hold: std::pin::Pin<Box<dyn std::future::Future<Output = Result<HeldLock, Error>> + '_>> =
        match args.permits {
            Some(permits) => {
                let mut permit = locks
                    .semaphore(&args.key, permits)
                    .acquire(args.ttl)
                    .options(args.options.clone());
                if let Some(min) = args.min_hold {
                    permit = permit.min_hold(min);
                }
                Box::pin(permit.send())
            }
            None => {
                let mut hold = locks
                    .hold(&args.key, args.ttl)
                    .options(args.options.clone());
                if let Some(min) = args.min_hold {
                    hold = hold.min_hold(min);
                }
                Box::pin(crate::status::while_waiting(
                    locks,
                    &args.key,
                    waiting,
                    hold.send(),
                ))
            }
        };
    tokio::select! {
        held = hold => match held {
            Ok(held) => Ok(held),
            Err(err) => {
                let uncertain = err.may_have_been_applied();
                if uncertain || !matches!(err, Error::Conflict(_) | Error::InvalidArgument(_)) {
                    release_own(locks, &args.key, token, uncertain).await;
                }
                Err(args.held.failure(&args.key, err))
            }
        },
        stop = signals.next() => {
            // A try may have been in flight.
            release_own(locks, &args.key, token, true).await;
            Err(fail(
                stop.shell_code(),
                format!("{stop:?} received while waiting for the lock; the command was not started"),
            ))
        }
    }
}

/// Best effort, after a failed or abandoned acquire with the caller's
/// token: a lease it obtained is released rather than left for its ttl
/// (with a generated token the client does this itself).
async fn release_own(locks: &Locks, key: &str, token: Option<&str>, late: bool) {
    let Some(token) = token else { return };
    match release_ignoring_conflict(locks, &lease_of(key, token)).await {
        // A try of the acquire may still land (held on its way, or behind
        // a gateway that answered 5xx). The token is the caller's: they
        // recover or release it once no try can land.
        Ok(()) if late => {
            warn(format_args!(
                "a try of the acquire may still be applied in the next {} s and hold {key} \
                 under your --token; acquire again with it, or release it, after then",
                (locks.client().timeout() + volcano::LATE_TRY_MARGIN).as_secs()
            ));
        }
        Ok(()) => {}
        // The token is the caller's: they can still release it.
        Err(err) => {
            warn(format_args!(
                "{key} may still be held under your --token until its ttl (the release after \
                 the failed acquire failed: {err})"
            ));
        }
    }
}

/// Releases `lease`; a `409` (another token holds the key) leaves nothing
/// of this token's to release.
async fn release_ignoring_conflict(locks: &Locks, lease: &LockLease) -> Result<(), Error> {
    match locks.release(lease).await {
        Err(Error::Conflict(_)) => Ok(()),
        other => other,
    }
}
