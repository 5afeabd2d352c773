//! A client that tries more one-off semaphores than it remembers
//! (semaphores in depth): what it remembers stays bounded, and it is the
//! most recently used (`engine/semaphore/memory.rs`: the idle ones past
//! the 64 most recently used are forgotten).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::program::ctx::Ctx;

/// How many idle semaphores a client remembers (the SDK's `KEPT_IDLE`).
const KEPT_IDLE: usize = 64;
/// Tries, of 80 one-off semaphores and one used again: more than a
/// client remembers.
const ONE_OFFS: usize = 90;
/// The one used again now and then (every [`AGAIN`]th try).
const AGAIN: usize = 9;

impl Ctx {
    /// Tries a permit of [`ONE_OFFS`] one-off semaphores in turn, and now
    /// and then one of its own used from the start. After each try the
    /// client remembers [`KEPT_IDLE`] idle semaphores and the one just
    /// tried (in use when the others were forgotten, as its try began),
    /// or all it used if fewer; the one just tried among them; and none
    /// it forgot was used after one it kept. (Tries often begin and end
    /// at one instant, say when no connection can be made: among those,
    /// which are forgotten is not said.)
    pub(in crate::program) async fn forgets_idle_semaphores(&self) {
        let again = (format!("kept-{}", self.id), 2);
        // When each semaphore's last try began and ended.
        let mut used: BTreeMap<(String, u32), (Duration, Duration)> = BTreeMap::new();
        for n in 0..ONE_OFFS {
            let name = if n % AGAIN == 0 {
                again.clone()
            } else {
                (format!("once-{}-{n}", self.id), 1)
            };
            let semaphore = self.locks.semaphore(name.0.as_str(), name.1);
            let began = turmoil::sim_elapsed().unwrap_or_default();
            let tried = semaphore
                .try_with_permit(Duration::from_secs(5), |_| async {
                    Ok::<_, volcano::Error>(())
                })
                .await;
            if let Err(err) = tried {
                self.failed(&format!("try_with_permit {}", name.0), &err);
            }
            let ended = turmoil::sim_elapsed().unwrap_or_default();
            used.insert(name.clone(), (began, ended));
            let kept = volcano::sim::remembered_semaphores(self.locks.client());
            let forgotten = used.keys().filter(|u| !kept.contains(u));
            // A semaphore forgotten though used after one kept ended.
            let wrongly = forgotten
                .filter(|f| {
                    kept.iter()
                        .filter_map(|k| used.get(k))
                        .any(|(_, kept_ended)| used[*f].0 > *kept_ended)
                })
                .collect::<Vec<_>>();
            let count = used.len().min(KEPT_IDLE + 1);
            if kept.len() != count || !kept.contains(&name) || !wrongly.is_empty() {
                self.broken(format!(
                    "after {} tries of {} semaphores, the client remembers {} (the {count} most \
                     recently used, the one just tried among them: {}); forgotten though used \
                     after one kept: {wrongly:?}",
                    n + 1,
                    used.len(),
                    kept.len(),
                    kept.contains(&name)
                ));
                return;
            }
        }
    }
}
