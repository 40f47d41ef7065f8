//! The pool layer's calls beyond `alloc`/`free`: what the hooks tell the pool about
//! synchronizations, IPC and device resets. One place, so the hooks do not depend on how
//! far the pool layer is.

/// The process synchronized the whole device itself.
#[inline]
pub(crate) fn note_process_sync() {
    crate::pool::note_process_sync();
}

/// `Some(code)`: refuse legacy IPC on this address (pool memory).
#[inline]
pub(crate) fn refuse_ipc(addr: u64) -> Option<i32> {
    crate::pool::refuse_ipc(addr)
}

/// The process destroys stream `stream` (before the real destroy).
#[inline]
pub(crate) fn retire_stream(stream: u64) {
    crate::pool::retire_stream(stream);
}

/// Everything `device`'s context held is gone.
#[inline]
pub(crate) fn on_device_reset(device: i32) {
    crate::pool::on_device_reset(device);
}

/// Device `accessor` was granted peer access to `owner`'s memory.
#[inline]
pub(crate) fn on_peer_access(owner: i32, accessor: i32) {
    crate::pool::on_peer_access(owner, accessor);
}
