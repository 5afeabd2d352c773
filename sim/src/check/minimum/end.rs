//! How a kept minimum's lease ended on the server, read off its journal.

use std::time::Duration;

use volcano_mock_server::Operation;

use crate::check::run::Run;
use crate::net::Attempt;

/// How a lease ended on the server: at `at` (sim time), by a release
/// (`released`) or at the expiry the last request that set one gave it
/// (`set_by`, when the clients' record has it), applied at `applied`;
/// `transit`: how long that request took to arrive.
pub(super) struct End<'a> {
    pub(super) at: Duration,
    pub(super) set_by: Option<&'a Attempt>,
    pub(super) released: bool,
    pub(super) applied: Duration,
    pub(super) transit: Duration,
}

/// How the lease `fence` of `key` (under `token`) ended on the server: a
/// walk of its journal in the order the server applied requests.
pub(super) fn lease_end<'a>(run: &Run<'a>, key: &str, fence: i64, token: &str) -> Option<End<'a>> {
    let attempt = |id: &Option<String>| {
        run.server
            .sent
            .attempts
            .iter()
            .find(|a| Some(&a.request_id) == id.as_ref())
    };
    let mut end = None;
    for r in run.server.journal.iter().filter(|r| r.key == key) {
        let applied = run.sim_time(r.at);
        match (r.operation, r.status) {
            (Operation::Acquire, Some(201)) | (Operation::Renew, Some(200))
                if r.fencing_token == Some(fence) =>
            {
                let Some(expires) = r.expires_at else {
                    continue;
                };
                let set_by = attempt(&r.request_id);
                end = Some(End {
                    at: run.sim_time(expires),
                    set_by,
                    released: false,
                    applied,
                    transit: set_by.map_or(Duration::ZERO, |a| applied.saturating_sub(a.sent)),
                });
            }
            (Operation::Release, Some(204)) => {
                let Some(a) = attempt(&r.request_id) else {
                    continue;
                };
                if a.token.as_deref() != Some(token) {
                    continue;
                }
                // A release of the lease while it was live ends it there.
                if let Some(live) = end.as_mut().filter(|e| !e.released && e.at > applied) {
                    *live = End {
                        at: applied,
                        set_by: None,
                        released: true,
                        applied,
                        transit: applied.saturating_sub(a.sent),
                    };
                }
            }
            _ => {}
        }
    }
    end
}
