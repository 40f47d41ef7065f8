//! A thread's trace entries ([`super::slots`]): a vector of plain entries (no drop) whose length is an
//! atomic word. The owning thread stores it with a plain (relaxed) store where `Vec::set_len`
//! would, so its hot path is the same, and the exit path may read it while the owner is
//! stopped inside its slot, or interrupted there by the signal handler that runs the exit,
//! without a data race or a torn read (`Slot::events_left`).

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error, realloc};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct Entries<T> {
    ptr: NonNull<T>,
    cap: usize,
    len: AtomicUsize,
}

// SAFETY: an `Entries` owns its allocation, as a `Vec<T>` does.
unsafe impl<T: Send> Send for Entries<T> {}

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Entries {
            ptr: NonNull::dangling(),
            cap: 0,
            len: AtomicUsize::new(0),
        }
    }
}

impl<T> Entries<T> {
    /// Entries are plain data with a size: nothing to drop (`clear` and `Drop` drop none),
    /// and an allocation of `n > 0` entries is not empty.
    const PLAIN: () = assert!(!std::mem::needs_drop::<T>() && std::mem::size_of::<T>() > 0);

    pub(crate) fn with_capacity(n: usize) -> Self {
        let mut e = Self::default();
        e.reserve(n);
        e
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The length word itself, for a reader on another thread or in a signal handler.
    pub(crate) fn len_word(&self) -> &AtomicUsize {
        &self.len
    }

    #[inline(always)]
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    #[inline(always)]
    pub(crate) fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// # Safety
    /// `n <= capacity()` and the entries below `n` are written.
    #[inline(always)]
    pub(crate) unsafe fn set_len(&mut self, n: usize) {
        self.len.store(n, Ordering::Relaxed);
    }

    pub(crate) fn push(&mut self, v: T) {
        let len = self.len();
        if len == self.cap {
            self.reserve(1);
        }
        // SAFETY: len < capacity (grown above): the slot lies inside the allocation; it is
        // written before the length counts it.
        unsafe {
            self.ptr.as_ptr().add(len).write(v);
            self.set_len(len + 1);
        }
    }

    /// Room for at least `additional` more entries (at least doubling when it grows).
    pub(crate) fn reserve(&mut self, additional: usize) {
        let () = Self::PLAIN;
        let need = self
            .len()
            .checked_add(additional)
            .expect("entries overflow");
        if need <= self.cap {
            return;
        }
        let cap = need.max(self.cap * 2).max(8);
        let layout = Layout::array::<T>(cap).expect("entries overflow");
        // SAFETY: a non-zero size (`cap >= 8`, `T` not zero-sized: `PLAIN`); the old block, if
        // any, was allocated with `Layout::array::<T>(self.cap)`; realloc keeps its entries.
        let p = unsafe {
            if self.cap == 0 {
                alloc(layout)
            } else {
                let old = Layout::array::<T>(self.cap).expect("entries overflow");
                realloc(self.ptr.as_ptr().cast(), old, layout.size())
            }
        };
        let Some(p) = NonNull::new(p.cast::<T>()) else {
            handle_alloc_error(layout)
        };
        self.ptr = p;
        self.cap = cap;
    }

    pub(crate) fn clear(&mut self) {
        self.len.store(0, Ordering::Relaxed);
    }
}

impl<T> Deref for Entries<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the first `len` entries of the allocation are written (`set_len`'s
        // contract); a dangling pointer with length 0 is a valid empty slice.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }
}

impl<T> DerefMut for Entries<T> {
    /// The entries, to change in place (the writer fills in a buffer's times before it codes
    /// them: `&mut self` is the buffer's only user then).
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`; `&mut self` excludes every other reference to the entries.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl<T> Drop for Entries<T> {
    fn drop(&mut self) {
        if self.cap != 0 {
            // SAFETY: allocated by `reserve` with this layout; `T` has nothing to drop (`PLAIN`).
            unsafe {
                dealloc(
                    self.ptr.as_ptr().cast(),
                    Layout::array::<T>(self.cap).expect("entries overflow"),
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Entries;

    #[test]
    fn pushes_grows_and_keeps_its_entries() {
        let mut e: Entries<u64> = Entries::default();
        assert_eq!((e.len(), e.capacity(), &e[..]), (0, 0, &[][..]));
        for i in 0..1000u64 {
            e.push(i * 3);
        }
        assert_eq!(e.len(), 1000);
        assert!(e.capacity() >= 1000);
        assert!(e.iter().enumerate().all(|(i, &v)| v == i as u64 * 3));
        e.clear();
        assert_eq!(e.len(), 0);
        e.reserve(5000);
        assert!(e.capacity() >= 5000);
        let mut f: Entries<u64> = Entries::with_capacity(4);
        // SAFETY: capacity 4, entry 0 written.
        unsafe {
            f.as_mut_ptr().write(7);
            f.set_len(1);
        }
        assert_eq!(&f[..], &[7]);
    }
}
