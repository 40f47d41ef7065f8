//! The live set of one device: address -> allocation, on the hot path of every Alloc and Free.
//!
//! An open-addressing table (linear probing, backward-shift deletion) with the keys in their own
//! array, so a probe touches 8 bytes per slot and a hit costs one multiply, one load and a
//! compare. `FastMap` (hashbrown) cost ~50 instructions per Alloc/Free pair more. Address 0 marks
//! an empty slot: the analysis never enters a failed allocation (address 0). Iteration order is
//! the table's; every reader of it must not depend on it (`DevState::snapshot` orders fully).

use super::Live;

pub(crate) struct LiveSet {
    keys: Vec<u64>,
    vals: Vec<Live>,
    len: usize,
    /// 64 - log2(capacity): the multiplicative hash keeps the top bits.
    shift: u32,
}

const EMPTY: u64 = 0;
const MIN_BITS: u32 = 6;

impl Default for LiveSet {
    fn default() -> Self {
        LiveSet::with_bits(MIN_BITS)
    }
}

impl LiveSet {
    fn with_bits(bits: u32) -> LiveSet {
        let cap = 1usize << bits;
        LiveSet {
            keys: vec![EMPTY; cap],
            vals: vec![Live::EMPTY; cap],
            len: 0,
            shift: 64 - bits,
        }
    }

    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        // Addresses are aligned and clustered: a multiply spreads them, the top bits index.
        (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.keys.len() - 1
    }

    /// The slot holding `addr`, if any.
    #[inline(always)]
    fn find(&self, addr: u64) -> Option<usize> {
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let k = self.keys[i];
            if k == addr {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn contains_key(&self, addr: &u64) -> bool {
        *addr != EMPTY && self.find(*addr).is_some()
    }

    /// Enters `addr` (not 0); returns the entry it replaced.
    #[inline]
    pub fn insert(&mut self, addr: u64, v: Live) -> Option<Live> {
        debug_assert!(addr != EMPTY);
        // At most a quarter full: runs stay short, so a removal's backward shift rarely moves
        // anything (a device's live set is tens to thousands of entries: the table is small).
        if (self.len + 1) * 4 > self.keys.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let k = self.keys[i];
            if k == addr {
                return Some(std::mem::replace(&mut self.vals[i], v));
            }
            if k == EMPTY {
                self.keys[i] = addr;
                self.vals[i] = v;
                self.len += 1;
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Takes `addr` out.
    #[inline(always)]
    pub fn remove(&mut self, addr: &u64) -> Option<Live> {
        if *addr == EMPTY {
            return None;
        }
        let mut i = self.find(*addr)?;
        let out = self.vals[i];
        self.len -= 1;
        // Backward shift: move later entries of the run into the hole when their home slot
        // does not lie cyclically in (hole, their slot], so every probe still finds them.
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let k = self.keys[j];
            if k == EMPTY {
                break;
            }
            let h = self.home(k);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(i) & mask) {
                self.keys[i] = k;
                self.vals[i] = self.vals[j];
                i = j;
            }
        }
        self.keys[i] = EMPTY;
        Some(out)
    }

    #[cold]
    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(self, LiveSet::with_bits(bits));
        for (k, v) in old.keys.iter().zip(&old.vals) {
            if *k != EMPTY {
                self.insert(*k, *v);
            }
        }
    }

    /// Every entry, in the table's order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Live)> {
        self.keys
            .iter()
            .zip(&self.vals)
            .filter(|(k, _)| **k != EMPTY)
            .map(|(k, v)| (*k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts, replacements and removals (clustered, aligned addresses like a device's,
    /// many collisions in a small table) give what a `HashMap` gives, step by step.
    #[test]
    fn behaves_like_a_map() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20 {
            let mut t = LiveSet::default();
            let mut m: HashMap<u64, Live> = HashMap::new();
            let span = [8u64, 64, 1000, 100_000][round % 4];
            for step in 0..20_000u64 {
                let addr = 0x7f00_0000_0000 + (rnd() % span) * 512;
                let live = Live {
                    size: step,
                    ..Live::EMPTY
                };
                match rnd() % 5 {
                    0..=1 => assert_eq!(
                        t.insert(addr, live).map(|l| l.size),
                        m.insert(addr, live).map(|l| l.size),
                        "insert {addr:#x} at {step}"
                    ),
                    2..=3 => assert_eq!(
                        t.remove(&addr).map(|l| l.size),
                        m.remove(&addr).map(|l| l.size),
                        "remove {addr:#x} at {step}"
                    ),
                    _ => assert_eq!(t.contains_key(&addr), m.contains_key(&addr)),
                }
                assert_eq!(t.len(), m.len());
            }
            let mut a: Vec<(u64, u64)> = t.iter().map(|(k, v)| (k, v.size)).collect();
            let mut b: Vec<(u64, u64)> = m.iter().map(|(k, v)| (*k, v.size)).collect();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b);
        }
    }
}
