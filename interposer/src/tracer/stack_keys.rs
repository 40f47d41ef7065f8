//! Tables of stacks seen: each stack's exact key -> its id, found by a fast hash the caller
//! computes once per event (no SipHash over the key: the key's hash is already a mix of
//! well-spread values), and always compared in full on a hit, so two stacks whose hashes
//! collide keep their own ids. The tensor-level route (`torch`) keys Python stacks by
//! [`Frame`]s; `--stacks` keys merged native+Python stacks by words (`stacks`).

/// One frame of a key: what names the code object (or its address), and the instruction
/// offset (an `i32` as `u32`).
pub(crate) use super::pyframes::Frame;

/// One step of the keys' hash (the FxHash-style multiply-rotate).
#[inline(always)]
pub(crate) fn mix(h: u64, v: u64) -> u64 {
    (h.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Hash -> the stacks with that hash (keys made of `F`s) and their ids: an open-addressed
/// table of (hash, key) slots probed linearly from the hash, at most half full, beside the
/// keys themselves. A lookup of a stack seen before is a probe or two and the comparison of
/// its key (about half the instructions of a `HashMap` of buckets).
pub(crate) struct StackKeys<F = Frame> {
    /// (hash, index in `keys` + 1), 0: an empty slot; a power of two long (or empty).
    slots: Vec<(u64, u32)>,
    keys: Vec<(Box<[F]>, u32)>,
}

impl<F> Default for StackKeys<F> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F> StackKeys<F> {
    /// An empty table (a `const` one, for a table built in a static).
    pub(crate) const fn new() -> Self {
        StackKeys {
            slots: Vec::new(),
            keys: Vec::new(),
        }
    }
}

/// The slot a probe for hash `h` starts at (`mask`: the table's length - 1). The hash's
/// halves folded: its low bits alone, the last multiply's, are the weakest.
#[inline(always)]
fn home(h: u64, mask: usize) -> usize {
    (h ^ h >> 32) as usize & mask
}

impl<F> StackKeys<F> {
    /// The id of the stack with hash `h` for which `eq` (an exact comparison with the
    /// caller's key) holds.
    #[inline]
    pub(crate) fn get(&self, h: u64, eq: impl Fn(&[F]) -> bool) -> Option<u32> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut i = home(h, mask);
        loop {
            let (sh, k) = self.slots[i];
            if k == 0 {
                return None;
            }
            if sh == h {
                let (key, id) = &self.keys[k as usize - 1];
                if eq(key) {
                    return Some(*id);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Records `key` (hash `h`, not present) as stack `id`.
    pub(crate) fn insert(&mut self, h: u64, key: Box<[F]>, id: u32) {
        if (self.keys.len() + 1) * 2 > self.slots.len() {
            self.grow();
        }
        self.keys.push((key, id));
        let k = self.keys.len() as u32;
        self.place(h, k);
    }

    fn place(&mut self, h: u64, k: u32) {
        let mask = self.slots.len() - 1;
        let mut i = home(h, mask);
        while self.slots[i].1 != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = (h, k);
    }

    #[cold]
    fn grow(&mut self) {
        let len = (self.slots.len() * 2).max(64);
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); len]);
        for (h, k) in old {
            if k != 0 {
                self.place(h, k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colliding_hashes_keep_their_own_ids() {
        let mut t = StackKeys::default();
        let a: Box<[Frame]> = vec![[1, 2], [3, 4]].into();
        let b: Box<[Frame]> = vec![[1, 2], [3, 5]].into();
        t.insert(7, a.clone(), 1);
        assert_eq!(t.get(7, |k| k == &b[..]), None, "a hit needs the same key");
        t.insert(7, b.clone(), 2);
        assert_eq!(t.get(7, |k| k == &a[..]), Some(1));
        assert_eq!(t.get(7, |k| k == &b[..]), Some(2));
        assert_eq!(t.get(8, |k| k == &a[..]), None);
    }

    /// Many keys, every hash shared by several of them and their slots crowded together:
    /// each is found with its own id after the table grew, none that was not put in is.
    #[test]
    fn every_key_keeps_its_id_as_the_table_grows() {
        let mut t = StackKeys::default();
        let key = |i: u64| -> Box<[Frame]> { vec![[i, i * 3]].into() };
        // 5 keys a hash, hashes that fold to neighbouring slots.
        let h = |i: u64| (i / 5) | (i / 5) << 32;
        for i in 0..1000u64 {
            assert_eq!(t.get(h(i), |k| k == &key(i)[..]), None);
            t.insert(h(i), key(i), i as u32 + 1);
        }
        for i in 0..1000u64 {
            assert_eq!(t.get(h(i), |k| k == &key(i)[..]), Some(i as u32 + 1));
        }
        assert_eq!(t.get(h(3), |k| k == &key(1000)[..]), None);
        assert_eq!(t.get(u64::MAX, |_| true), None);
    }
}
