//! Random workloads that are the same on every run: [`XorShift`] numbers, and the random
//! one-stream round ([`one_stream_round`]) the pool's repeated-workload tests and examples
//! make as replay events or as an RMM log.

/// xorshift64: a stream of numbers fixed by its seed, the same on every run and machine.
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The stream of `seed` spread over the bits (any seed, 0 included: the state is odd).
    pub fn seeded(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number (never 0 from a seed that is not 0).
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// One event of a [`one_stream_round`]: a block (numbered from 0 in allocation order) and
/// its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundStep {
    Alloc { id: u64, size: u64 },
    Free { id: u64, size: u64 },
}

/// A random round of a repeated workload on one stream: 60-199 draws, each an allocation of
/// one of `sizes` (10 in 18), a free of a random live block (7 in 18) or nothing; then every
/// block still live freed (in the order the frees left them in the live list).
pub fn one_stream_round(r: &mut XorShift, sizes: &[u64]) -> Vec<RoundStep> {
    let mut round = Vec::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut id = 0;
    for _ in 0..60 + r.below(140) {
        match r.below(18) {
            0..10 => {
                let size = sizes[r.below(sizes.len() as u64) as usize];
                round.push(RoundStep::Alloc { id, size });
                live.push((id, size));
                id += 1;
            }
            10..17 if !live.is_empty() => {
                let (id, size) = live.swap_remove(r.below(live.len() as u64) as usize);
                round.push(RoundStep::Free { id, size });
            }
            _ => {}
        }
    }
    round.extend(
        live.into_iter()
            .map(|(id, size)| RoundStep::Free { id, size }),
    );
    round
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_numbers_on_every_run() {
        let mut r = XorShift(1);
        let got: Vec<u64> = (0..4).map(|_| r.below(u64::MAX)).collect();
        // xorshift64 (13, 7, 17) from 1.
        assert_eq!(got[0], 1082269761);
        assert_eq!(XorShift::seeded(0).0, 1);
        let a = one_stream_round(&mut XorShift::seeded(5), &[1, 2, 3]);
        assert_eq!(a, one_stream_round(&mut XorShift::seeded(5), &[1, 2, 3]));
    }

    #[test]
    fn a_round_frees_every_block_once() {
        for seed in 0..50 {
            let round = one_stream_round(&mut XorShift::seeded(seed), &[4096, 1 << 20]);
            let mut live = std::collections::HashMap::new();
            for s in &round {
                match *s {
                    RoundStep::Alloc { id, size } => assert!(live.insert(id, size).is_none()),
                    RoundStep::Free { id, size } => assert_eq!(live.remove(&id), Some(size)),
                }
            }
            assert!(live.is_empty(), "seed {seed}: {live:?} never freed");
            assert!(round.len() >= 2, "seed {seed}");
        }
    }
}
