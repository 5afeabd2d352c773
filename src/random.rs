//! Every random number the SDK draws: ownership tokens, request ids and
//! jitter. They come from the thread's generator; a simulation (feature
//! `sim`) seeds its own, so that one seed replays exactly.

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{Rng, RngCore};

thread_local! {
    /// The seeded generator of a simulation running on this thread.
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

fn draw<T>(f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
    SEEDED.with_borrow_mut(|seeded| match seeded {
        Some(rng) => f(rng),
        None => f(&mut rand::rng()),
    })
}

/// Uniform in `[0, 1)`.
pub(crate) fn unit() -> f64 {
    draw(|rng| rng.random::<f64>())
}

pub(crate) fn u64() -> u64 {
    draw(|rng| rng.next_u64())
}

pub(crate) fn bytes16() -> [u8; 16] {
    // One fill, not sixteen draws of a byte each through `dyn RngCore`.
    let mut bytes = [0u8; 16];
    draw(|rng| rng.fill_bytes(&mut bytes));
    bytes
}

/// From now on this thread draws from a generator seeded with `seed`
/// (`None`: the thread's own again).
#[cfg(feature = "sim")]
pub(crate) fn seed(seed: Option<u64>) {
    use rand::SeedableRng;
    SEEDED.with_borrow_mut(|seeded| *seeded = seed.map(StdRng::seed_from_u64));
}
