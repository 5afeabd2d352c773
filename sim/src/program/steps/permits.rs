//! Semaphores (`locks.semaphore`): a scope under a permit that waits for
//! one (`with_permit`), a try that does not wait (`try_with_permit`) on a
//! semaphore some of whose permits are taken by hand, as other processes
//! would take them, and a permit's own `acquire` with a minimum hold (let
//! go of as `steps/let_go.rs` does).

use std::time::Duration;

use crate::log::Event;
use crate::program::ctx::Ctx;
use crate::program::op::{one_in, poll_for};
use volcano_mock_server::{Fault, Operation};

impl Ctx {
    /// Works under a permit: half the time in a `with_permit` scope on
    /// `{key}-sem` (two permits) that waits for one; a quarter a try on
    /// `{key}-sem3` (three permits) that does not wait; a quarter a
    /// permit's `acquire` on `{key}-sem` with a minimum hold.
    pub(super) async fn with_permit(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        self.semaphore_says_what_it_is(key);
        if one_in(coin >> 61, 4) {
            self.permit_refuses_bad_input(key, ttl).await;
        }
        match (coin >> 54) % 4 {
            0 => self.try_permit(key, ttl, work, coin).await,
            1 => self.permit_with_minimum(key, ttl, wait, work, coin).await,
            2 if one_in(coin >> 56, 2) => self.permit_rotation(key, ttl, coin).await,
            _ => self.permit_scope(key, ttl, wait, work, coin).await,
        }
    }

    /// A semaphore handle names itself, its count and its permits' keys as
    /// built, and judges its own name and count before anything is sent.
    fn semaphore_says_what_it_is(&self, key: &str) {
        let name = format!("{key}-sem3");
        let semaphore = self.locks.semaphore(name.as_str(), 3);
        let said = (
            semaphore.name(),
            semaphore.permits(),
            semaphore.permit_key(2),
            semaphore.check().is_ok(),
        );
        if said != (name.as_str(), 3, format!("{name}:2"), true) {
            self.broken(format!("semaphore({name:?}, 3) says {said:?}"));
        }
        // The edges: 0 and 101 permits are refused, 100 are not; a name
        // whose last permit's key is the longest valid key (128
        // characters) passes, one character more does not.
        let longest = "n".repeat(128 - ":99".len());
        let too_long = format!("{longest}n");
        for (name, permits, valid) in [
            (name.as_str(), 0, false),
            (name.as_str(), 101, false),
            (name.as_str(), 100, true),
            (longest.as_str(), 100, true),
            (too_long.as_str(), 100, false),
        ] {
            let checked = self.locks.semaphore(name, permits).check();
            let refused = matches!(checked, Err(volcano::Error::InvalidArgument(_)));
            if refused == valid {
                self.broken(format!(
                    "semaphore of {permits} named {} characters long: check() said {checked:?}",
                    name.len()
                ));
            }
        }
    }

    /// A permit's acquire refuses bad input before anything is sent: a cap
    /// under a second, a token of the caller's.
    async fn permit_refuses_bad_input(&self, key: &str, ttl: Duration) {
        let name = format!("{key}-sem");
        let semaphore = self.locks.semaphore(name.as_str(), 2);
        let token = volcano::AcquireOptions::default().token(crate::program::op::uuid_from(7));
        let tries = [
            (
                "max_hold(999 ms)",
                semaphore.acquire(ttl).max_hold(Duration::from_millis(999)),
            ),
            (
                "a token of the caller's",
                semaphore.acquire(ttl).options(token),
            ),
        ];
        for (what, acquire) in tries {
            match acquire.await {
                Err(volcano::Error::InvalidArgument(_)) => {}
                Ok(held) => {
                    self.broken(format!("a permit of {name} with {what} was granted"));
                    let _ = held.release_now().await;
                }
                Err(err) => self.broken(format!("a permit of {name} with {what}: {err}")),
            }
        }
    }

    /// Logs the start of a wait for a permit of `name`, until `wait` from
    /// now.
    fn permit_wait(&self, name: &str, wait: Duration, poll: Duration) {
        self.log.push(Event::PermitWait {
            client: self.id,
            name: name.to_owned(),
            until: turmoil::sim_elapsed().unwrap_or_default() + wait,
            poll,
            permits: 2,
        });
    }

    /// Acquires the permits `which` of `semaphore` by hand (plain acquires
    /// of their keys, as other processes would hold them).
    async fn take_by_hand(
        &self,
        semaphore: &volcano::Semaphore,
        which: impl IntoIterator<Item = u32>,
        ttl: Duration,
    ) -> Vec<volcano::LockLease> {
        let mut taken = Vec::new();
        for i in which {
            let permit = semaphore.permit_key(i);
            match self.locks.acquire(&permit, ttl).await {
                Ok(lease) => {
                    self.log.push(Event::Leased {
                        client: self.id,
                        key: permit,
                        fence: lease.fencing_token(),
                    });
                    taken.push(lease);
                }
                Err(err) => self.failed(&format!("acquire {permit} by hand"), &err),
            }
        }
        taken
    }

    /// Releases a lease taken by hand, noting a release that did not free it.
    async fn release_by_hand(&self, lease: volcano::LockLease) {
        let permit = lease.key().to_owned();
        let released = self.locks.release(&lease).await;
        if released.is_err() {
            self.kept(&permit, Some(lease.fencing_token()));
        }
        self.released(&permit, released);
    }

    /// Logs the end of a wait for a permit.
    fn permit_wait_ended<T>(&self, outcome: &volcano::Result<T>) {
        self.log.push(Event::PermitWaitEnded {
            client: self.id,
            held: outcome.as_ref().is_err_and(volcano::Error::is_lock_held),
        });
    }

    /// Works in a `with_permit` scope of `{key}-sem`, waiting for a permit.
    async fn permit_scope(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        let name = format!("{key}-sem");
        let semaphore = self.locks.semaphore(name.as_str(), 2);
        let scope = semaphore.with_permit(ttl, |guard| async move {
            let ended = self.believe(&guard);
            self.work(&[&guard], work).await;
            Ok::<_, volcano::Error>(ended)
        });
        self.permit_wait(&name, wait, poll_for(coin));
        let scope = scope.wait(wait).poll_interval(poll_for(coin)).send();
        let (outcome, ()) = tokio::join!(scope, self.spend_quota(&name, coin));
        self.permit_wait_ended(&outcome);
        match outcome {
            Ok(ended) => ended.await,
            Err(err) => self.failed(&format!("with_permit {name}"), &err),
        }
    }

    /// A wait for a permit of `{key}-sem` while this program holds both
    /// by hand (plain acquires of their keys), polling every 0.5 s; 2 s to
    /// 4 s in, one of them is released: the wait must find it, however its
    /// rounds rotate. Half the time that one is not released but left to
    /// lapse (taken for the shortest lease, 5 s, the other for 30 s): a
    /// permit freed by no release of this client, which only the rounds'
    /// rotation finds.
    async fn permit_rotation(&self, key: &str, ttl: Duration, coin: u64) {
        let name = format!("{key}-sem");
        let semaphore = self.locks.semaphore(name.as_str(), 2);
        let which = ((coin >> 59) % 2) as usize;
        let lapses = one_in(coin >> 50, 2);
        let mut by_hand = if lapses {
            let mut taken = Vec::new();
            for i in 0..2u32 {
                let ttl = if i as usize == which { 5 } else { 30 };
                taken.extend(
                    self.take_by_hand(&semaphore, [i], Duration::from_secs(ttl))
                        .await,
                );
            }
            taken
        } else {
            self.take_by_hand(&semaphore, 0..2, ttl).await
        };
        let (wait, poll) = (Duration::from_secs(20), Duration::from_millis(500));
        self.permit_wait(&name, wait, poll);
        let freed_after = Duration::from_millis(2_000 + (coin >> 57) % 2_000);
        let mut freed = (by_hand.len() == 2).then(|| by_hand.remove(which));
        if lapses {
            // Left to lapse: released by nobody.
            if let Some(lease) = freed.take() {
                self.kept(lease.key(), Some(lease.fencing_token()));
            }
        }
        // Believed the moment the wait returns, not once the others end.
        let waiting = async {
            let acquired = semaphore
                .acquire(ttl)
                .wait(wait)
                .poll_interval(poll)
                .send()
                .await;
            let ended = acquired.as_ref().ok().map(|held| self.believe(held));
            (acquired, ended)
        };
        let freeing = async {
            let Some(lease) = freed else { return };
            tokio::time::sleep(freed_after).await;
            self.release_by_hand(lease).await;
        };
        let ((acquired, ended), (), ()) =
            tokio::join!(waiting, freeing, self.spend_quota(&name, coin));
        self.permit_wait_ended(&acquired);
        match acquired {
            Ok(held) => {
                self.work(&[&*held], Duration::from_millis(300)).await;
                let permit = held.key().to_owned();
                self.released(&permit, held.release().await);
                if let Some(ended) = ended {
                    ended.await;
                }
            }
            Err(err) => self.failed(&format!("acquire a permit of {name}"), &err),
        }
        for lease in by_hand {
            self.release_by_hand(lease).await;
        }
    }

    /// Half the time, while a wait for a permit of `name` pauses: a 429
    /// (a window of 1 s) to one of its tries, then one to a look of this
    /// client at another key, which spends the client's quota: the wait
    /// must pause past each window (`check/permit_pace.rs`).
    async fn spend_quota(&self, name: &str, coin: u64) {
        if !one_in(coin >> 48, 2) {
            return;
        }
        let (tried, looked) = (
            format!("{name}:{}", (coin >> 49) % 2),
            format!("{name}-quota"),
        );
        if let Some(mock) = crate::lock(&self.server).as_ref() {
            for (operation, key) in [(Operation::Acquire, &tried), (Operation::Get, &looked)] {
                mock.inject(Fault::status(429).on(operation).key(key.as_str()).times(1));
            }
        }
        self.log.push(Event::Fault {
            what: format!("quota-spent-beside 429 on Acquire of {tried} and on Get of {looked}"),
        });
        tokio::time::sleep(Duration::from_millis(1_000 + (coin >> 50) % 1_500)).await;
        let _ = self.locks.get(&looked).await;
    }

    /// A `try_with_permit` on `{key}-sem3`, which must say "every permit
    /// taken" only when it saw each one held. Half the time two of its
    /// permits are first taken by hand (plain acquires of their keys, as
    /// other processes would hold them, unknown to this client's memory of
    /// the semaphore): the try must find the third.
    async fn try_permit(&self, key: &str, ttl: Duration, work: Duration, coin: u64) {
        let name = format!("{key}-sem3");
        let semaphore = self.locks.semaphore(name.as_str(), 3);
        let by_hand = if one_in(coin >> 56, 2) {
            let spare = ((coin >> 57) % 3) as u32;
            let taken = (0..3).filter(|&i| i != spare);
            self.take_by_hand(&semaphore, taken, ttl).await
        } else {
            Vec::new()
        };
        let began = turmoil::sim_elapsed().unwrap_or_default();
        let tried = semaphore
            .try_with_permit(ttl, |guard| async move {
                let ended = self.believe(&guard);
                self.work(&[&guard], work).await;
                Ok::<_, volcano::Error>(ended)
            })
            .await;
        self.log.push(Event::PermitTry {
            client: self.id,
            name: name.clone(),
            permits: 3,
            began,
            all_taken: matches!(tried, Ok(None)),
        });
        match tried {
            Ok(Some(ended)) => ended.await,
            Ok(None) => self.note(format!("try_with_permit {name}: every permit taken")),
            Err(err) => self.failed(&format!("try_with_permit {name}"), &err),
        }
        for lease in by_hand {
            self.release_by_hand(lease).await;
        }
    }

    /// A permit of `{key}-sem` by its own `acquire`, waiting for one, with
    /// a minimum hold: used, then let go of ([`Ctx::let_go_after`]).
    async fn permit_with_minimum(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        let name = format!("{key}-sem");
        let semaphore = self.locks.semaphore(name.as_str(), 2);
        let min = Duration::from_millis(1_000 + (coin >> 44) % 8_000);
        self.permit_wait(&name, wait, poll_for(coin));
        let acquired = semaphore
            .acquire(ttl)
            .wait(wait)
            .poll_interval(poll_for(coin))
            .min_hold(min)
            .await;
        self.permit_wait_ended(&acquired);
        let held = match acquired {
            Ok(held) => held,
            Err(err) => return self.failed(&format!("acquire a permit of {name}"), &err),
        };
        let began = self.clock.now();
        let ended = self.believe(&held);
        self.work(&[&*held], work).await;
        self.let_go_after(held, (min, None), began, coin).await;
        ended.await;
    }
}
