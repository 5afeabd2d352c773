//! A client that tries more one-off semaphores than it remembers
//! (semaphores in depth): what it remembers stays bounded, and it is the
//! most recently used (`engine/semaphore/memory.rs`: the idle ones past
//! the 64 most recently used are forgotten).

use std::collections::VecDeque;
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
    /// and then one of its own used from the start: after each, the
    /// client remembers exactly the most recently used: [`KEPT_IDLE`]
    /// idle ones and the one just tried (it was in use when the others
    /// were forgotten, as its try began).
    pub(in crate::program) async fn forgets_idle_semaphores(&self) {
        let again = (format!("kept-{}", self.id), 2);
        // The semaphores used, most recent first, each once.
        let mut used: VecDeque<(String, u32)> = VecDeque::new();
        for n in 0..ONE_OFFS {
            let name = if n % AGAIN == 0 {
                again.clone()
            } else {
                (format!("once-{}-{n}", self.id), 1)
            };
            let semaphore = self.locks.semaphore(name.0.as_str(), name.1);
            let tried = semaphore
                .try_with_permit(Duration::from_secs(5), |_| async {
                    Ok::<_, volcano::Error>(())
                })
                .await;
            if let Err(err) = tried {
                self.failed(&format!("try_with_permit {}", name.0), &err);
            }
            used.retain(|u| *u != name);
            used.push_front(name);
            let remembered = volcano::sim::remembered_semaphores(self.locks.client());
            let mut recent: Vec<_> = used.iter().take(KEPT_IDLE + 1).cloned().collect();
            let mut kept = remembered.clone();
            recent.sort();
            kept.sort();
            if kept != recent {
                let forgotten: Vec<_> = recent.iter().filter(|u| !kept.contains(u)).collect();
                self.broken(format!(
                    "after {} tries of one-off semaphores, the client remembers {} (the {} most recently \
                     used); forgotten of those: {forgotten:?}",
                    n + 1,
                    remembered.len(),
                    KEPT_IDLE + 1
                ));
                return;
            }
        }
    }
}
