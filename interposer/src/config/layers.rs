//! The layers a request meets, cached in one byte: the pipeline computes the bits from the
//! layers' own switches on the first request and after any change, and reads them with one
//! relaxed load per request. The cache lives here, below the layers whose switches it
//! caches, so that a layer that turns itself on or off (the tracer, the log level) can say
//! so without importing the pipeline.

use std::sync::atomic::{
    AtomicU8,
    Ordering::{Relaxed, SeqCst},
};

/// The bits (0 = compute them again). The cap and the pool read their configuration once,
/// the first time they are asked, and afterwards only ever turn off (each still checks
/// itself when its bit sends a request to it); the tracer (which turns on at load, and off
/// when its file fails or at exit) and the log level call [`changed`] whenever they change.
static LAYERS: AtomicU8 = AtomicU8::new(0);

/// The cached bits, 0 when they must be computed again.
#[inline(always)]
pub(crate) fn cached() -> u8 {
    LAYERS.load(Relaxed)
}

/// Store freshly computed bits (never 0).
pub(crate) fn store(bits: u8) {
    LAYERS.store(bits, SeqCst);
}

/// A layer's switch changed: compute the bits again on the next request.
pub(crate) fn changed() {
    LAYERS.store(0, SeqCst);
}
