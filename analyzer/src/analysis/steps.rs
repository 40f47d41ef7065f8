//! Every change of a device's in-use bytes, kept compactly: a varint of the time since the
//! previous change and a zigzag varint of the change in bytes (3-6 bytes per allocation or
//! free instead of 16), so lining up several large traces by GPU stays within memory.

/// An append-only log of (monotonic ns, in-use bytes) in time order.
#[derive(Clone, Debug, Default)]
pub struct StepLog {
    buf: Vec<u8>,
    last_t: u64,
    last_v: u64,
    len: u64,
}

fn put(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn get(buf: &[u8], p: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    while let Some(&b) = buf.get(*p) {
        *p += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            break;
        }
        shift += 7;
    }
    v
}

impl StepLog {
    /// Appends a change. A time earlier than the last one (events of two threads a little
    /// out of order) is taken as the last one: the log stays in time order.
    #[inline]
    pub fn push(&mut self, t_ns: u64, bytes: u64) {
        let t = t_ns.max(self.last_t);
        put(&mut self.buf, t - self.last_t);
        let d = bytes.wrapping_sub(self.last_v) as i64;
        put(&mut self.buf, ((d << 1) ^ (d >> 63)) as u64);
        self.last_t = t;
        self.last_v = bytes;
        self.len += 1;
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the log occupies.
    pub fn footprint(&self) -> usize {
        self.buf.capacity()
    }

    /// The last (time, bytes), if any.
    pub fn last(&self) -> Option<(u64, u64)> {
        (self.len > 0).then_some((self.last_t, self.last_v))
    }

    /// The changes in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (mut p, mut t, mut v) = (0usize, 0u64, 0u64);
        std::iter::from_fn(move || {
            if p >= self.buf.len() {
                return None;
            }
            t += get(&self.buf, &mut p);
            let z = get(&self.buf, &mut p);
            v = v.wrapping_add(((z >> 1) as i64 ^ -((z & 1) as i64)) as u64);
            Some((t, v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_in_order_and_small() {
        let mut l = StepLog::default();
        let want = [
            (1_000, 4096),
            (1_050, 0),
            (900, 1 << 40), // out of order: kept at 1_050
            (5_000_000_000, u64::MAX),
            (5_000_000_001, 7),
        ];
        for &(t, b) in &want {
            l.push(t, b);
        }
        let got: Vec<_> = l.iter().collect();
        assert_eq!(
            got,
            [
                (1_000, 4096),
                (1_050, 0),
                (1_050, 1 << 40),
                (5_000_000_000, u64::MAX),
                (5_000_000_001, 7)
            ]
        );
        assert_eq!(l.len(), 5);
        assert_eq!(l.last(), Some((5_000_000_001, 7)));
        // Typical steps (a few us apart, a few MiB) take a few bytes each.
        let mut l = StepLog::default();
        for i in 0..1000u64 {
            l.push(i * 3_000, (i % 7) << 20);
        }
        assert!(l.buf.len() <= 6 * 1000, "{}", l.buf.len());
    }
}
