//! Tables of stacks seen: each stack's exact key -> its id, found by a fast hash the caller
//! computes once per event (no SipHash over the key: the key's hash is already a mix of
//! well-spread values), and always compared in full on a hit, so two stacks whose hashes
//! collide keep their own ids. The tensor-level route (`torch`) keys Python stacks by
//! [`Frame`]s; `--stacks` keys merged native+Python stacks by words (`stacks`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// One frame of a key: what names the code object (or its address), and the instruction
/// offset (an `i32` as `u32`).
pub(crate) use super::pyframes::Frame;

/// Hashes a `u64` key that is already a hash: the value itself.
#[derive(Default)]
pub(crate) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the map's keys are u64); anything else still hashes.
        for &b in bytes {
            self.0 = mix(self.0, b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// One step of the keys' hash (the FxHash-style multiply-rotate).
#[inline(always)]
pub(crate) fn mix(h: u64, v: u64) -> u64 {
    (h.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The stacks with one hash (almost always one) and their ids.
type Bucket<F> = Vec<(Box<[F]>, u32)>;

/// Hash -> the stacks with that hash (keys made of `F`s).
pub(crate) struct StackKeys<F = Frame> {
    map: HashMap<u64, Bucket<F>, BuildHasherDefault<Prehashed>>,
}

impl<F> Default for StackKeys<F> {
    fn default() -> Self {
        StackKeys {
            map: HashMap::default(),
        }
    }
}

impl<F> StackKeys<F> {
    /// The id of the stack with hash `h` for which `eq` (an exact comparison with the
    /// caller's key) holds.
    #[inline]
    pub(crate) fn get(&self, h: u64, eq: impl Fn(&[F]) -> bool) -> Option<u32> {
        self.map
            .get(&h)?
            .iter()
            .find(|(k, _)| eq(k))
            .map(|&(_, id)| id)
    }

    /// Records `key` (hash `h`, not present) as stack `id`.
    pub(crate) fn insert(&mut self, h: u64, key: Box<[F]>, id: u32) {
        self.map.entry(h).or_default().push((key, id));
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
}
