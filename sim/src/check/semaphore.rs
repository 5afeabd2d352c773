//! Semaphores: a program's `with_permit` on `{key}-sem` (two permits) only
//! ever takes `{key}-sem:0` or `{key}-sem:1`. With exclusion per key
//! (checked for every key), the server then never lets more than two
//! holders of a semaphore hold at once.

use volcano_mock_server::Operation;

use super::run::Run;

/// The permits a semaphore of the programs has.
const PERMITS: u32 = 2;

/// Every grant of a semaphore's key is one of its permits.
pub(super) fn within_count(run: &Run<'_>, out: &mut Vec<String>) {
    for r in &run.server.journal {
        if r.operation != Operation::Acquire || r.status != Some(201) {
            continue;
        }
        let Some((name, index)) = r.key.rsplit_once(':') else {
            continue;
        };
        if !name.ends_with("-sem") {
            continue;
        }
        if index.parse::<u32>().map_or(true, |i| i >= PERMITS) {
            out.push(format!(
                "semaphore {name} of {PERMITS} permits: the server granted {} (fence {:?}), \
                 a permit past its count",
                r.key, r.fencing_token
            ));
        }
    }
}
