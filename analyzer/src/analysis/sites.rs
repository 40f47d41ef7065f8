//! Per-call-site counters indexed by stack id. The interposer numbers stacks 1, 2, 3... so a
//! vector is a perfect hash for them; ids past `DENSE` (imported traces, a wrapped counter) go to
//! a map. A site exists once it has an allocation or a failure, so all-zero slots are "absent".

use super::SiteAcc;
use crate::fastmap::FastMap;

const DENSE: u32 = 1 << 20;

#[derive(Default)]
pub(crate) struct SiteTable {
    dense: Vec<SiteAcc>,
    sparse: FastMap<u32, SiteAcc>,
}

impl SiteTable {
    /// The counters of `id`, created when missing.
    #[inline]
    pub fn entry(&mut self, id: u32) -> &mut SiteAcc {
        if id < DENSE {
            let i = id as usize;
            if i >= self.dense.len() {
                self.grow(i);
            }
            &mut self.dense[i]
        } else {
            self.sparse.entry(id).or_default()
        }
    }

    #[cold]
    fn grow(&mut self, i: usize) {
        self.dense
            .resize((i + 1).next_power_of_two().max(64), SiteAcc::default());
    }

    /// The counters of `id` when that site has been seen.
    #[inline]
    pub fn get_mut(&mut self, id: u32) -> Option<&mut SiteAcc> {
        if id < DENSE {
            self.dense.get_mut(id as usize).filter(|s| !s.is_empty())
        } else {
            self.sparse.get_mut(&id)
        }
    }

    /// Every site seen, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &SiteAcc)> {
        self.dense
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i as u32, s))
            .chain(self.sparse.iter().map(|(&k, s)| (k, s)))
    }
}

impl SiteAcc {
    #[inline]
    fn is_empty(&self) -> bool {
        self.allocs == 0 && self.failed == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_ids_behave_alike() {
        let mut t = SiteTable::default();
        for id in [0, 3, 1000, DENSE - 1, DENSE, u32::MAX] {
            assert!(t.get_mut(id).is_none());
            t.entry(id).allocs += 1;
            t.entry(id).bytes += id as u64;
            assert_eq!(t.get_mut(id).map(|s| s.allocs), Some(1));
        }
        t.entry(7).failed += 1;
        let mut seen: Vec<(u32, u64)> = t.iter().map(|(k, s)| (k, s.allocs)).collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            vec![
                (0, 1),
                (3, 1),
                (7, 0),
                (1000, 1),
                (DENSE - 1, 1),
                (DENSE, 1),
                (u32::MAX, 1)
            ]
        );
    }
}
