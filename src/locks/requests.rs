//! `renew`, `get`, `release` and `force_release`: each validates its
//! arguments, builds its operation and sends it once.

use std::time::Duration;

use super::{Common, Measured};
use crate::error::Result;
use crate::lease::{LockLease, LockState};
use crate::ops;
use crate::validate;

/// `locks.renew(&lease, ttl)`; see [`Locks::renew`](crate::Locks::renew).
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Renew {
    pub(super) common: Common,
    pub(super) lease: LockLease,
    pub(super) ttl: Duration,
}

common_methods!(Renew => LockLease);

impl Renew {
    async fn execute(self) -> Result<LockLease> {
        self.send_measured().await.map(|measured| measured.lease)
    }

    /// Renews and also returns what a guard needs to time the lease.
    pub(crate) async fn send_measured(mut self) -> Result<Measured> {
        let ttl = validate::ttl(self.ttl)?;
        validate::key(self.lease.key())?;
        validate::uuid("token", self.lease.token())?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        let sent_at = self.common.locks.client.lease_clock().now();
        let op = ops::Renew {
            lease: &self.lease,
            ttl_secs: ttl,
        };
        let answer = self
            .common
            .send(&op, &request_id, Default::default())
            .await?;
        let clock = self.common.locks.client.lease_clock();
        Ok(Measured::new(answer.value, sent_at, answer.date, clock))
    }
}

/// `locks.get(key)`; see [`Locks::get`](crate::Locks::get).
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Get {
    pub(super) common: Common,
    pub(super) key: String,
}

common_methods!(Get => LockState);

impl Get {
    async fn execute(self) -> Result<LockState> {
        self.send_dated().await.map(|(state, _)| state)
    }

    /// The state, and the answer's `Date` (the server's clock), from which
    /// a waiter reads how long the holder has left without comparing
    /// clocks.
    pub(crate) async fn send_dated(
        mut self,
    ) -> Result<(LockState, Option<chrono::DateTime<chrono::Utc>>)> {
        validate::key(&self.key)?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        let op = ops::Get { key: &self.key };
        let answer = self
            .common
            .send(&op, &request_id, Default::default())
            .await?;
        Ok((answer.value, answer.date))
    }
}

/// `locks.release(&lease)`; see [`Locks::release`](crate::Locks::release).
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Release {
    pub(super) common: Common,
    pub(super) lease: LockLease,
}

common_methods!(Release => ());

impl Release {
    async fn execute(mut self) -> Result<()> {
        validate::key(self.lease.key())?;
        validate::uuid("token", self.lease.token())?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        let op = ops::Release { lease: &self.lease };
        self.common
            .send(&op, &request_id, Default::default())
            .await?;
        self.common.locks.client.turns().freed(self.lease.key());
        tracing::debug!(
            key = self.lease.key(),
            fencing_token = self.lease.fencing_token(),
            request_id,
            "lock released"
        );
        Ok(())
    }
}

/// `locks.force_release(key)`; see [`Locks::force_release`](crate::Locks::force_release).
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct ForceRelease {
    pub(super) common: Common,
    pub(super) key: String,
}

common_methods!(ForceRelease => ());

impl ForceRelease {
    async fn execute(mut self) -> Result<()> {
        validate::key(&self.key)?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        let op = ops::ForceRelease { key: &self.key };
        self.common
            .send(&op, &request_id, Default::default())
            .await?;
        self.common.locks.client.turns().freed(&self.key);
        tracing::info!(key = %self.key, request_id, "lock force-released");
        Ok(())
    }
}
