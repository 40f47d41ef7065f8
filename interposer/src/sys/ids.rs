//! Cheap identities: the caller's kernel thread id (cached per thread) and the process id.

/// Kernel thread id of the caller (`gettid`), cached after the first call on each thread in
/// the hooks' thread state (`guard`: initial-exec TLS, no `__tls_get_addr`, no destructor,
/// valid during thread exit too).
#[inline]
pub(crate) fn tid() -> u32 {
    let st = crate::sys::thread::state();
    let v = st.tid.get();
    if v != 0 {
        return v;
    }
    tid_slow(st)
}

#[cold]
fn tid_slow(st: &crate::sys::thread::State) -> u32 {
    // SAFETY: gettid has no preconditions.
    let v = unsafe { libc::gettid() } as u32;
    st.tid.set(v);
    v
}

/// Process id (not cached: cheap, and correct after fork).
#[inline]
pub(crate) fn pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Forget the cached thread id (the forking thread has a new tid in the child).
pub(crate) fn on_fork_child() {
    crate::sys::thread::state().tid.set(0);
}

#[cfg(test)]
mod tests {
    #[test]
    fn tid_is_stable() {
        assert_eq!(super::tid(), super::tid());
    }
}
