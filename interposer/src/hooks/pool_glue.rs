//! The pool layer's calls beyond `alloc`/`free`: what the hooks tell the pool about
//! synchronizations, IPC and device resets. One place, so the hooks do not depend on how
//! far the pool layer is. (The pool's `note_process_sync`, `refuse_ipc` and
//! `on_device_reset` are not in the pool layer yet: these are no-ops until they are.)

/// The process synchronized the whole device itself.
#[inline]
pub(crate) fn note_process_sync() {}

/// `Some(code)`: refuse legacy IPC on this address (pool memory).
#[inline]
pub(crate) fn refuse_ipc(_addr: u64) -> Option<i32> {
    None
}

/// Everything `device`'s context held is gone.
#[inline]
pub(crate) fn on_device_reset(_device: i32) {}
