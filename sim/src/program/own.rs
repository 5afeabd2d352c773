//! Holds under the program's own token: given as one option or all at
//! once (`AcquireOptions`), recovered the documented way after a failure
//! or a dropped hold, and released by hand.

use std::time::Duration;

use volcano::AcquireOptions;

use super::ctx::Ctx;
use super::op::{max_hold_for, one_in, poll_for, timeout_for, uuid_from};
use crate::log::Event;

impl Ctx {
    /// Frees whatever lease `token` may hold on `key` (release is
    /// idempotent), trying again while the failure is transient.
    async fn release_own(&self, key: &str, token: String) {
        let orphan = volcano::LockLease::new(key, token, chrono::DateTime::UNIX_EPOCH, 0);
        for _ in 0..4 {
            match self.locks.release(&orphan).await {
                Err(err) if err.is_transient() => {
                    self.note(format!("release {key} of own token failed, again: {err}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(err) => {
                    self.kept(key, None);
                    return self.note(format!("release {key} of own token: {err}"));
                }
                Ok(()) => return self.released(key, Ok(())),
            }
        }
        self.kept(key, None);
    }

    /// A hold under the program's own token, released or dropped. A
    /// failure, or the program dropping it (see [`Ctx::recover_own`]), is
    /// recovered the documented way: hold again with the same token
    /// (idempotent: it gets back the lease if it is still ours), then
    /// release.
    pub(super) async fn own_token(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        let token = uuid_from(coin);
        self.log.push(Event::OwnToken {
            client: self.id,
            key: key.to_owned(),
            token_hash: crate::log::token_hash(&token),
        });
        let poll = poll_for(coin);
        let hold = self.locks.hold(key, ttl);
        let hold = if one_in(coin >> 11, 2) {
            hold.options(self.asked(key, &token, wait, poll, coin))
        } else {
            hold.token(token.clone()).wait(wait).poll_interval(poll)
        };
        match hold.await {
            Ok(held) => self.use_held(held, work, coin).await,
            Err(err) => {
                self.failed(&format!("hold {key} with own token"), &err);
                self.recover_own(key, token, ttl).await;
            }
        }
    }

    /// The options of a hold under `token`, set all at once as a caller
    /// that reads them from its own configuration does (the `volcano` CLI
    /// builds its flags into one): a request id of the program's own, and
    /// at times a request timeout and a cap. Each reads back as set; the
    /// checks follow the request id and the timeout on the wire.
    fn asked(
        &self,
        key: &str,
        token: &str,
        wait: Duration,
        poll: Duration,
        coin: u64,
    ) -> AcquireOptions {
        let request_id = uuid_from(coin.rotate_left(17));
        let timeout = one_in(coin >> 13, 2).then(|| timeout_for(coin >> 5));
        let max_hold = one_in(coin >> 15, 3).then(|| max_hold_for(coin >> 9));
        let options = AcquireOptions::default()
            .token(token.to_owned())
            .request_id(request_id.clone())
            .wait(wait)
            .poll_interval(poll)
            .set_timeout(timeout)
            .set_max_hold(max_hold);
        let read = (
            options.get_request_id(),
            options.get_timeout(),
            options.get_wait(),
            options.get_poll_interval(),
            options.get_max_hold(),
        );
        let set = (
            Some(request_id.as_str()),
            timeout,
            Some(wait),
            Some(poll),
            max_hold,
        );
        if read != set || options.get_token() != Some(token) {
            let token_read = options.get_token() == Some(token);
            self.log.push(Event::Contract {
                client: self.id,
                what: format!(
                    "AcquireOptions read back {read:?} (its token as set: {token_read}); set {set:?}"
                ),
            });
        }
        self.log.push(Event::Asked {
            client: self.id,
            key: key.to_owned(),
            request_id,
            timeout,
        });
        options
    }

    /// After an abandoned or failed hold under `token`: holds again with
    /// it, without waiting, works a little if that got the lease back,
    /// and releases whatever the token may hold.
    pub(super) async fn recover_own(&self, key: &str, token: String, ttl: Duration) {
        match self.locks.hold(key, ttl).token(token.clone()).await {
            Ok(held) => {
                let ended = self.believe(&held);
                self.work(&[&*held], Duration::from_secs(1)).await;
                self.released(key, held.release().await);
                ended.await;
            }
            Err(err) => self.note(format!("recovering {key} with own token: {err}")),
        }
        self.release_own(key, token).await;
    }
}
