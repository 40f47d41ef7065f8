//! Memory over time in bounded space: a fixed number of time buckets whose width doubles
//! (pairs merge) whenever the trace outlasts them. Each bucket keeps min/max/last of in-use and
//! max/last of reserved, so a 10M-event trace plots as ~2000 points without losing spikes.

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Bucket {
    pub used: bool,
    pub in_min: u64,
    pub in_max: u64,
    pub in_last: u64,
    pub has_res: bool,
    pub res_max: u64,
    pub res_last: u64,
}

impl Bucket {
    fn merge(a: Bucket, b: Bucket) -> Bucket {
        let mut r = Bucket::default();
        match (a.used, b.used) {
            (false, false) => {}
            (true, false) => {
                (r.used, r.in_min, r.in_max, r.in_last) = (true, a.in_min, a.in_max, a.in_last)
            }
            (false, true) => {
                (r.used, r.in_min, r.in_max, r.in_last) = (true, b.in_min, b.in_max, b.in_last)
            }
            (true, true) => {
                (r.used, r.in_min, r.in_max, r.in_last) = (
                    true,
                    a.in_min.min(b.in_min),
                    a.in_max.max(b.in_max),
                    b.in_last,
                )
            }
        }
        r.has_res = a.has_res || b.has_res;
        r.res_max = match (a.has_res, b.has_res) {
            (true, true) => a.res_max.max(b.res_max),
            (true, false) => a.res_max,
            (false, true) => b.res_max,
            _ => 0,
        };
        r.res_last = if b.has_res { b.res_last } else { a.res_last };
        r
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Mark {
    pub t_ns: u64,
    /// "refusal" or "oom".
    pub kind: &'static str,
    pub size: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Timeline {
    pub t0: u64,
    pub width_ns: u64,
    pub buckets: Vec<Bucket>,
    pub marks: Vec<Mark>,
    /// (time, cap) whenever the cap changed.
    pub caps: Vec<(u64, u64)>,
    pub marks_dropped: u64,
    /// The last bucket written and its time range [lo, hi): events come in time order, so most
    /// land in it and need no division.
    #[serde(skip)]
    last: (usize, u64, u64),
}

const MAX_MARKS: usize = 2000;

impl Timeline {
    pub fn new(t0: u64, points: usize) -> Timeline {
        Timeline {
            t0,
            width_ns: 1000,
            buckets: vec![Bucket::default(); points.max(2) & !1],
            marks: Vec::new(),
            caps: Vec::new(),
            marks_dropped: 0,
            last: (0, 1, 0),
        }
    }

    #[inline]
    fn slot(&mut self, t: u64) -> usize {
        let (i, lo, hi) = self.last;
        if t >= lo && t < hi {
            return i;
        }
        self.find(t)
    }

    fn find(&mut self, t: u64) -> usize {
        let rel = t.saturating_sub(self.t0);
        let mut idx = rel / self.width_ns;
        while idx >= self.buckets.len() as u64 {
            self.coarsen();
            idx = rel / self.width_ns;
        }
        let start = |i: u64| self.t0.saturating_add(i.saturating_mul(self.width_ns));
        let lo = if idx == 0 { 0 } else { start(idx) };
        self.last = (idx as usize, lo, start(idx + 1));
        idx as usize
    }

    #[cold]
    fn coarsen(&mut self) {
        let n = self.buckets.len();
        for i in 0..n / 2 {
            self.buckets[i] = Bucket::merge(self.buckets[2 * i], self.buckets[2 * i + 1]);
        }
        for b in &mut self.buckets[n / 2..] {
            *b = Bucket::default();
        }
        self.width_ns = self.width_ns.saturating_mul(2);
        self.last = (0, 1, 0);
    }

    #[inline]
    pub fn in_use(&mut self, t: u64, v: u64) {
        let i = self.slot(t);
        self.put(i, v);
    }

    #[inline]
    fn put(&mut self, i: usize, v: u64) {
        let b = &mut self.buckets[i];
        if b.used {
            b.in_min = b.in_min.min(v);
            b.in_max = b.in_max.max(v);
        } else {
            b.used = true;
            b.in_min = v;
            b.in_max = v;
        }
        b.in_last = v;
    }

    /// In use `v` and reserved `r` at `t` (one bucket lookup for both).
    #[inline]
    pub fn in_use_reserved(&mut self, t: u64, v: u64, r: u64) {
        let i = self.slot(t);
        self.put(i, v);
        self.put_reserved(i, r);
    }

    pub fn reserved(&mut self, t: u64, v: u64) {
        let i = self.slot(t);
        self.put_reserved(i, v);
    }

    #[inline]
    fn put_reserved(&mut self, i: usize, v: u64) {
        let b = &mut self.buckets[i];
        b.res_max = if b.has_res { b.res_max.max(v) } else { v };
        b.res_last = v;
        b.has_res = true;
    }

    pub fn cap(&mut self, t: u64, cap: u64) {
        if self.caps.last().map(|c| c.1) != Some(cap) {
            self.caps.push((t, cap));
        }
    }

    pub fn mark(&mut self, t: u64, kind: &'static str, size: u64) {
        if self.marks.len() < MAX_MARKS {
            self.marks.push(Mark {
                t_ns: t,
                kind,
                size,
            });
        } else {
            self.marks_dropped += 1;
        }
    }

    /// Points to draw: (bucket start time, in-use min, in-use max, reserved max or None), with
    /// empty buckets carrying the previous value forward, up to the last bucket with data.
    pub fn points(&self) -> Vec<Point> {
        let last = self
            .buckets
            .iter()
            .rposition(|b| b.used || b.has_res)
            .map(|i| i + 1)
            .unwrap_or(0);
        let mut out = Vec::with_capacity(last);
        let (mut cur, mut res): (u64, Option<u64>) = (0, None);
        for (i, b) in self.buckets[..last].iter().enumerate() {
            let (lo, hi) = if b.used {
                (b.in_min, b.in_max)
            } else {
                (cur, cur)
            };
            let r = if b.has_res { Some(b.res_max) } else { res };
            out.push(Point {
                t_ns: self.t0 + i as u64 * self.width_ns,
                in_min: lo,
                in_max: hi,
                reserved: r,
            });
            if b.used {
                cur = b.in_last;
            }
            if b.has_res {
                res = Some(b.res_last);
            }
        }
        out
    }
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Point {
    pub t_ns: u64,
    pub in_min: u64,
    pub in_max: u64,
    pub reserved: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_spikes_when_coarsening() {
        let mut t = Timeline::new(0, 8);
        for i in 0..1000u64 {
            t.in_use(i * 1000, if i == 500 { 1_000_000 } else { i });
        }
        let pts = t.points();
        assert!(pts.len() <= 8);
        assert_eq!(pts.iter().map(|p| p.in_max).max(), Some(1_000_000));
        assert_eq!(pts[0].in_min, 0);
    }

    #[test]
    fn cached_bucket_matches_direct_lookup() {
        // Mostly increasing times with jumps back (late events), across many coarsenings.
        let mut cached = Timeline::new(5_000, 16);
        let mut direct = Timeline::new(5_000, 16);
        let mut x: u64 = 1;
        for i in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let t = if x.is_multiple_of(7) {
                i * 997 / 2
            } else {
                i * 997
            } + (x >> 60);
            // The value is the time, so an event put in a neighbouring bucket shows in its max.
            cached.in_use(t, t);
            let j = direct.find(t);
            direct.put(j, t);
        }
        assert_eq!(cached.width_ns, direct.width_ns);
        assert_eq!(cached.points(), direct.points());
    }
}
