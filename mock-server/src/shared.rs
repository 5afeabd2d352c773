//! What every handler shares: the configuration fixed at start ([`Config`])
//! and the server's state ([`Shared`]: leases, faults, clock, journal,
//! quota). Below every handler and the router; it imports none of them.

use std::time::Duration;

use crate::clock::Clock;
use crate::fault_store::Faults;
use crate::journal::Journal;
use crate::quota::Quota;
use crate::state::{LockSnapshot, Store};

/// Server configuration, fixed when it starts.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) service_key: String,
    pub(crate) anon_key: String,
    pub(crate) rate_limit: Option<u32>,
    pub(crate) header_read_timeout: Duration,
}

/// Everything the handlers share; a `MockServer` is a handle on it.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) store: Store,
    pub(crate) faults: Faults,
    pub(crate) clock: Clock,
    pub(crate) journal: Journal,
    pub(crate) quota: Quota,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        Self::with_clock(config, Clock::new())
    }

    pub(crate) fn with_clock(config: Config, clock: Clock) -> Self {
        Shared {
            quota: Quota::new(config.rate_limit),
            config,
            store: Store::new(),
            faults: Faults::default(),
            clock,
            journal: Journal::default(),
        }
    }

    pub(crate) fn locks(&self) -> Vec<LockSnapshot> {
        self.store.snapshot(self.clock.now())
    }

    /// Forgets leases, faults, the journal and the quota window. The clock
    /// and the fencing counter keep going.
    pub(crate) fn reset(&self) {
        self.store.clear();
        self.faults.clear();
        self.journal.clear();
        self.quota.clear();
    }
}
