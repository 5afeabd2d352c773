//! The hosts of one run and what they share: the server host (the mock
//! server's lock logic on the simulated network), one host per program,
//! and the log, fenced store and sent-request record they write to.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use volcano_mock_server::{LockSnapshot, MockServer};

use crate::check;
use crate::log::Log;
use crate::net::{Senders, PORT, SERVER};
use crate::program::{Gate, Program, SERVICE_KEY};
use crate::{client_name, lock, Options};

/// The simulation's start, in Unix seconds (any fixed time will do).
pub(crate) const EPOCH_SECS: i64 = 1_780_000_000;

/// What the hosts of a run share with the driver and the checks.
#[derive(Default)]
pub(crate) struct World {
    pub(crate) log: Log,
    gate: Gate,
    senders: Senders,
    /// The server, once its host has started it.
    pub(crate) server: Arc<Mutex<Option<MockServer>>>,
    /// When it started (simulated time).
    started: Arc<Mutex<Duration>>,
}

fn epoch() -> DateTime<Utc> {
    DateTime::from_timestamp(EPOCH_SECS, 0).unwrap_or_default()
}

impl World {
    /// The server host: the mock server without a listener of its own,
    /// serving every connection the simulated network accepts.
    pub(crate) fn serve(&self, sim: &mut turmoil::Sim<'_>) {
        let (server, started) = (self.server.clone(), self.started.clone());
        sim.host(SERVER, move || {
            let (server, started) = (server.clone(), started.clone());
            async move {
                let addr = std::net::SocketAddr::from(([0, 0, 0, 0], PORT));
                let mock = MockServer::builder()
                    .service_key(SERVICE_KEY)
                    .rate_limit(600)
                    .start_detached(addr, epoch())?;
                *lock(&started) = turmoil::sim_elapsed().unwrap_or_default();
                *lock(&server) = Some(mock);
                let listener = turmoil::net::TcpListener::bind(addr).await?;
                loop {
                    let (stream, _) = listener.accept().await?;
                    let connection = lock(&server).as_ref().map(|m| m.serve_connection(stream));
                    if let Some(connection) = connection {
                        tokio::spawn(connection);
                    }
                }
            }
        });
    }

    /// One host per program (hosts rather than turmoil clients, so that
    /// they can crash); returns each one's lease-clock slot, for suspends.
    pub(crate) fn programs(
        &self,
        sim: &mut turmoil::Sim<'_>,
        seed: u64,
        options: &Options,
    ) -> Vec<Arc<Mutex<Option<volcano::LeaseClock>>>> {
        let keys: Vec<String> = (0..options.keys).map(|k| format!("key-{k}")).collect();
        let mut clocks = Vec::new();
        for id in 0..options.clients {
            let clock = Arc::default();
            clocks.push(Arc::clone(&clock));
            let program = Program {
                id,
                seed: seed.wrapping_mul(1_000_003).wrapping_add(id as u64),
                keys: keys.clone(),
                steps: options.steps,
                log: self.log.clone(),
                gate: self.gate.clone(),
                senders: self.senders.clone(),
                clock,
                clock_rate: options.clock_rate,
                depth: options.depth,
                server: self.server.clone(),
            };
            let program = std::cell::RefCell::new(Some(program));
            sim.host(client_name(id), move || {
                let program = program.borrow_mut().take();
                async move {
                    match program {
                        Some(program) => program.run().await,
                        None => Ok(()),
                    }
                }
            });
        }
        clocks
    }

    /// The server's leases at simulated time `now` (its clock having
    /// jumped by `jumped` so far), with its clock's reading then; `None`
    /// before it started.
    pub(crate) fn leases(
        &self,
        now: Duration,
        jumped: Duration,
    ) -> Option<(Vec<LockSnapshot>, DateTime<Utc>)> {
        let started = *lock(&self.started);
        let since =
            chrono::TimeDelta::from_std(now.saturating_sub(started) + jumped).unwrap_or_default();
        lock(&self.server).as_ref().map(|mock| {
            let mut locks = mock.locks();
            locks.sort_by(|a, b| a.key.cmp(&b.key));
            (locks, epoch() + since)
        })
    }

    /// What the checks need from the server, once it has started, with
    /// its leases when the programs ended (`at_end`, from
    /// [`World::leases`]).
    pub(crate) fn server_view(
        &self,
        (locks_at_end, now_at_end): (Vec<LockSnapshot>, DateTime<Utc>),
    ) -> Option<check::Server> {
        let started = *lock(&self.started);
        lock(&self.server).as_ref().map(|mock| check::Server {
            journal: mock.requests(),
            locks_at_end,
            now_at_end,
            epoch: epoch(),
            started,
            sent: lock(&self.senders).clone(),
        })
    }

    /// Every attempt the clients sent (with its answer), then the server's
    /// journal, as trace lines; each journal line names the client that
    /// sent the request.
    pub(crate) fn journal_trace(&self) -> String {
        let Some(mock) = lock(&self.server).as_ref().map(|m| m.requests()) else {
            return String::new();
        };
        let senders = lock(&self.senders);
        let mut out = String::new();
        for a in &senders.attempts {
            let answer = a.answer.as_ref().map_or_else(
                || "no answer".to_owned(),
                |o| format!("answered {} fence {:?} at {:?}", o.status, o.fence, o.at),
            );
            out.push_str(&format!(
                "sent by client {} at {:?}: {:?} {} id {} {answer}\n",
                a.client, a.sent, a.operation, a.key, a.request_id
            ));
        }
        for r in mock {
            let sender = r.request_id.as_ref().and_then(|id| senders.by_id.get(id));
            out.push_str(&format!(
                "server {} {} {:?} {} status {:?} fence {:?} from client {:?} fault {:?} id {:?}\n",
                r.seq,
                r.at.format("%H:%M:%S%.3f"),
                r.operation,
                r.key,
                r.status,
                r.fencing_token,
                sender,
                r.fault,
                r.request_id
            ));
        }
        out
    }
}
