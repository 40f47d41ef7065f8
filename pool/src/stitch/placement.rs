//! Placement: where a new block of a given size goes with the pages and mappings held now
//! (a cached mapping, a gap in a shared small page, or free pages with packed head and tail).

use super::*;

impl Stitch {
    /// Cached blocks overlapping `[off, off + size)` of mapping `m`, in page order: what a
    /// block placed there dissolves (a carve of a kept range, a mapping grown in place).
    pub(super) fn cached_in(&self, m: u32, off: u64, size: u64) -> Vec<u64> {
        let mut victims = Vec::new();
        for (p, s, e) in self.pieces(&self.map(m).pages, off, size) {
            for (_, &(oe, a)) in self.page(p).occ.range(..e) {
                if oe > s
                    && !victims.contains(&a)
                    && self
                        .blocks
                        .get(a)
                        .is_some_and(|b| b.state == BState::Cached)
                {
                    victims.push(a);
                }
            }
        }
        victims
    }

    /// The lifetime class of the next allocations (0 by default). Blocks of different
    /// classes never share a page: a page takes the class of its first block and, while any
    /// byte of it is used, only blocks of that class (placement, exact-size reuse and mapping
    /// reuse of the pool without a budget; the arena and the round replay of a budgeted pool
    /// do not look at classes, so near the device's limit such a pool keeps large blocks out
    /// of the arena: see `Stitch::lifetimes_near_limit`). A caller that knows which blocks die together (e.g. before the peak of a
    /// pass) keeps the pages of the short-lived ones whole for the peak: see
    /// `examples/pool_lifetimes.rs`. Set once a class other than 0 was set, the pool leaves
    /// its no-lookup fast path (every cached block's class is checked).
    #[doc(hidden)]
    pub fn set_lifetime_class(&mut self, class: u8) {
        if class != 0 && !self.faults.mix_lifetimes {
            self.lives = true;
            self.update_slow_only();
        }
        self.life = class;
    }

    /// Page `p` may take a block of the current lifetime class (a used page of another class
    /// may not; a free page may).
    pub(super) fn life_ok(&self, p: u32) -> bool {
        let pg = self.page(p);
        !self.lives || pg.used == 0 || pg.life == self.life
    }

    /// The cached block `id` lies in pages of the current lifetime class.
    pub(super) fn block_life_ok(&self, id: u32) -> bool {
        let b = self.blocks.at(id);
        let pages = &self.map(b.map).pages;
        let first = (b.off / self.gran) as usize;
        let last = ((b.off + b.size - 1) / self.gran) as usize;
        pages[first..=last]
            .iter()
            .all(|&p| self.page(p).life == self.life)
    }

    /// Every used page under `[off, off + size)` of mapping `m` is of the current class.
    pub(super) fn window_life_ok(&self, m: u32, off: u64, size: u64) -> bool {
        !self.lives
            || self
                .pieces(&self.map(m).pages, off, size)
                .iter()
                .all(|&(p, _, _)| self.life_ok(p))
    }

    /// Best placement of `size` bytes with the pages held now, or None. `mix`: also use the
    /// other class's shared pages; `run_ends`: new mappings over handles' free ends may be
    /// planned (see `run_ends_plan`, `Stitch::run_ends_room`).
    pub(super) fn place(
        &self,
        size: u64,
        mix: bool,
        allow_new: bool,
        run_ends: bool,
    ) -> Option<Plan> {
        if allow_new
            && run_ends
            && self.shapes != Shapes::Pages
            && self.class_of(size) == LARGE
            && !self.ends_first
        {
            // existing mappings first (no driver call)
            if let Some(plan) = self.place_pages(size, mix, false) {
                return Some(plan);
            }
            let take_free = |k: u64, not: &[u32]| self.take_free_pages(k, not);
            if let Some(plan) = self.run_ends_plan(size, &take_free) {
                return Some(plan);
            }
        }
        match self.place_pages(size, mix, allow_new)? {
            Plan::New { pages, off } => self.whole_runs(pages, off),
            plan => Some(plan),
        }
    }

    /// A new mapping's pages with its head and tail pages widened to their whole runs (a
    /// head is the last page of its run, a tail the first: see `index`), the block's offset
    /// moved by the head run's other pages. None if head and tail are of one run.
    fn whole_runs(&self, mut pages: Vec<u32>, mut off: u64) -> Option<Plan> {
        let n = pages.len();
        // a head or tail holds bytes (pages taken whole come with their whole runs already)
        let run_of = |p: u32| {
            let pg = self.page(p);
            (pg.run > 1 && pg.used > 0 && !self.faults.stitch_run_pages).then_some(pg.handle)
        };
        let head = run_of(pages[0]);
        let tail = if n > 1 { run_of(pages[n - 1]) } else { None };
        if head.is_none() && tail.is_none() {
            return Some(Plan::New { pages, off });
        }
        if head.is_some() && head == tail {
            return None;
        }
        if let Some(h) = tail {
            // the tail page is its run's first: the rest of the run follows it
            pages.pop();
            pages.extend_from_slice(&self.runs[&h]);
        }
        if let Some(h) = head {
            // the head page is its run's last: the rest of the run comes before it
            let run = &self.runs[&h];
            off += (run.len() as u64 - 1) * self.gran;
            let mut all = run.clone();
            all.extend_from_slice(&pages[1..]);
            pages = all;
        }
        Some(Plan::New { pages, off })
    }

    fn place_pages(&self, size: u64, mix: bool, allow_new: bool) -> Option<Plan> {
        let g = self.gran;
        let cls = self.class_of(size);
        let classes: &[usize] = match (mix, cls) {
            (false, SMALL) => &[SMALL],
            (false, _) => &[LARGE],
            (true, SMALL) => &[SMALL, LARGE],
            (true, _) => &[LARGE, SMALL],
        };
        // best fit (len, page) >= min over the allowed classes, skipping page `not`
        let best = |sets: &[BTreeSet<(u64, u32)>; 2], min: u64, not: Option<u32>| {
            classes
                .iter()
                .filter_map(|&c| {
                    sets[c]
                        .range((min, 0)..)
                        .find(|x| Some(x.1) != not && self.life_ok(x.1))
                        .copied()
                })
                .min()
        };
        let largest = |sets: &[BTreeSet<(u64, u32)>; 2]| {
            classes
                .iter()
                .filter_map(|&c| sets[c].iter().rev().find(|x| self.life_ok(x.1)).copied())
                .max()
        };
        // A. existing mappings (no driver call)
        if size <= g {
            // best-fit free range of a shared page (always mapped somewhere)
            let r = classes
                .iter()
                .filter_map(|&c| {
                    self.ranges[c]
                        .range((size, 0, 0)..)
                        .find(|x| self.life_ok(x.1))
                        .copied()
                })
                .min();
            if let Some((len, p, s)) = r
                && let Some(&m) = self.page(p).maps.first()
            {
                let e = s + len;
                // keep prefixes and suffixes whole for heads and tails
                let pos = if s == 0 && e < g { e - size } else { s };
                let idx = self.map(m).pages.iter().position(|&q| q == p).unwrap() as u64;
                return Some(Plan::Existing {
                    map: m,
                    off: idx * g + pos,
                });
            }
            // a free page that is mapped (under a budget only through a mapping of that page
            // alone: a block in one page of a longer mapping would keep the whole mapping,
            // and so all its pages, from being given back)
            let alone = self.budget.is_some();
            for &p in self.free_pages.iter().take(MAP_SCAN) {
                let m = if alone {
                    self.page(p)
                        .maps
                        .iter()
                        .copied()
                        .find(|&m| self.map(m).pages.len() == 1)
                } else {
                    self.page(p).maps.first().copied()
                };
                if let Some(m) = m {
                    let idx = self.map(m).pages.iter().position(|&q| q == p).unwrap() as u64;
                    return Some(Plan::Existing {
                        map: m,
                        off: idx * g,
                    });
                }
            }
        }
        if cls == LARGE && !self.ends_first {
            let n_min = size.div_ceil(g) as usize;
            for n in [n_min.max(2), n_min.max(2) + 1] {
                let Some(list) = self.maps_by_len.get(&n) else {
                    continue;
                };
                for &m in list.iter().rev().take(MAP_SCAN) {
                    if let Some(off) = self.fit_in_mapping(m, size, classes) {
                        return Some(Plan::Existing { map: m, off });
                    }
                }
            }
        }
        if !allow_new {
            return None;
        }
        // B. new mapping over free resources
        let k0 = size / g;
        let r = size % g;
        // whole free pages: those with a handle of their own first, then runs with no byte
        // used, whole and in order (a run is mapped only whole), exactly `k` pages or None
        let take_free = |k: u64| self.take_free_pages(k, &[]);
        // Near the device's limit, a remainder of half a page or more from page ends (see
        // `ends`)
        if self.ends_first
            && r >= g / 2
            && let Some(plan) = self.ends_plan(size, classes, &take_free)
        {
            return Some(plan);
        }
        // Tier 1: no new holes. A partly used page's free end is consumed whole (head = its
        // whole free suffix, or tail = its whole free prefix) when that saves a fresh page;
        // the rest comes from fresh pages, whose leftover is again a clean prefix or suffix.
        if r > 0 && (cls == LARGE || mix) {
            // best fit >= r saves a fresh page; otherwise the largest free end still packs
            let head = best(&self.suffix, r, None);
            let tail = best(&self.prefix, r, None);
            let pick = match (head, tail) {
                (Some(h), Some(t)) => Some(if h.0 <= t.0 { (h, true) } else { (t, false) }),
                (Some(h), None) => Some((h, true)),
                (None, Some(t)) => Some((t, false)),
                (None, None) => {
                    let pick = |h: Option<(u64, u32)>, t: Option<(u64, u32)>| match (h, t) {
                        (Some(h), Some(t)) => Some(if h.0 >= t.0 { (h, true) } else { (t, false) }),
                        (Some(h), None) => Some((h, true)),
                        (None, Some(t)) => Some((t, false)),
                        (None, None) => None,
                    };
                    let any = pick(largest(&self.suffix), largest(&self.prefix));
                    // near the limit, an end of a page no other block of a page or more
                    // holds, where that costs no fresh page more (see `ends`)
                    match self
                        .ends_first
                        .then(|| self.own_end(size, classes, any))
                        .flatten()
                    {
                        Some(own) => Some(own),
                        None => any,
                    }
                }
            };
            if let Some(((len, p), use_head)) = pick
                && len < size
            {
                let rest = size - len;
                let n = rest.div_ceil(g);
                if let Some(fresh) = take_free(n) {
                    return Some(if use_head {
                        let mut pages = vec![p];
                        pages.extend(fresh);
                        Plan::New {
                            pages,
                            off: g - len,
                        }
                    } else {
                        let mut pages = fresh;
                        pages.push(p);
                        Plan::New {
                            pages,
                            off: n * g - rest,
                        }
                    });
                }
            }
        }
        if let Some(pages) = take_free(size.div_ceil(g)) {
            return Some(Plan::New { pages, off: 0 });
        }
        // Tier 2: use partly used pages' free ends even if that leaves a hole.
        if cls == LARGE || mix {
            if r > 0
                && let Some(middle) = take_free(k0)
            {
                // tail: best-fit prefix
                if let Some((_, t)) = best(&self.prefix, r, None) {
                    let mut pages = middle;
                    pages.push(t);
                    return Some(Plan::New { pages, off: 0 });
                }
                // head: best-fit suffix
                if let Some((_, h)) = best(&self.suffix, r, None) {
                    let mut pages = vec![h];
                    pages.extend(middle);
                    return Some(Plan::New { pages, off: g - r });
                }
                // split: largest suffix as head, best-fit prefix for the rest
                if let Some((hl, h)) = largest(&self.suffix) {
                    let need = r - hl.min(r);
                    if let Some((_, t)) = best(&self.prefix, need, Some(h)) {
                        let mut pages = vec![h];
                        pages.extend(middle);
                        pages.push(t);
                        return Some(Plan::New { pages, off: g - hl });
                    }
                }
            }
            if k0 >= 1
                && let Some(middle) = take_free(k0 - 1)
            {
                // one page fewer: head + tail make up a page plus the remainder
                if let Some((hl, h)) = largest(&self.suffix) {
                    let need = r + g - hl; // > r, <= g
                    if need < g
                        && let Some((_, t)) = best(&self.prefix, need, Some(h))
                    {
                        let mut pages = vec![h];
                        pages.extend(middle);
                        pages.push(t);
                        return Some(Plan::New { pages, off: g - hl });
                    }
                }
            }
        }
        None
    }

    /// Exactly `k` whole free pages a new mapping may take: pages with a handle of their own
    /// first, then runs with no byte used, whole and in order (a run is mapped only whole);
    /// with handles sized per request, runs first, longest first. None if they do not add
    /// up to `k`. `not`: runs (named by their first page) not to take.
    pub(super) fn take_free_pages(&self, k: u64, not: &[u32]) -> Option<Vec<u32>> {
        let mut free_runs = self.free_runs();
        free_runs.retain(|r| !not.contains(&r[0]));
        // handles sized per request: whole runs first, longest first, then pages of a
        // handle of their own (fewest handles, so fewest maps)
        if self.shapes != Shapes::Pages && !free_runs.is_empty() {
            let mut out: Vec<u32> = Vec::new();
            for run in &free_runs {
                if out.len() + run.len() <= k as usize {
                    out.extend_from_slice(run);
                }
            }
            let need = k as usize - out.len();
            if self.free_pages.len() >= need {
                out.extend(self.free_pages.iter().take(need).copied());
                return Some(out);
            }
        }
        let mut out: Vec<u32> = self.free_pages.iter().take(k as usize).copied().collect();
        for run in &free_runs {
            let need = k as usize - out.len();
            if need == 0 {
                break;
            }
            if run.len() <= need {
                out.extend_from_slice(run);
            }
        }
        (out.len() as u64 == k).then_some(out)
    }

    /// Runs of which no page holds a byte, longest first (then by first page, so the order
    /// is deterministic): whole pages a new mapping may take, each run whole and in order.
    pub(super) fn free_runs(&self) -> Vec<Vec<u32>> {
        if self.bound_free.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<Vec<u32>> = self
            .runs
            .values()
            .filter(|r| r.iter().all(|q| self.bound_free.contains(q)))
            .cloned()
            .collect();
        out.sort_by(|a, b| b.len().cmp(&a.len()).then(a[0].cmp(&b[0])));
        out
    }

    pub(super) fn class_of(&self, size: u64) -> usize {
        if size <= self.gran / 2 { SMALL } else { LARGE }
    }

    /// A cached mapping that can host `size` bytes once the cached blocks in the way are
    /// dissolved (live and pending blocks stay): `(mapping, offset, blocks to dissolve)`.
    /// This is what keeps a repeating workload free of driver calls: a request that misses
    /// the exact-size cache takes the mapping an earlier pass made for it.
    pub(super) fn reuse_mapping(&self, size: u64) -> Option<(u32, u64, Vec<u64>)> {
        let g = self.gran;
        let n_min = size.div_ceil(g) as usize;
        let pinned = |a: u64| {
            self.blocks
                .get(a)
                .is_some_and(|b| b.state != BState::Cached)
        };
        for n in [n_min, n_min + 1] {
            let Some(list) = self.maps_by_len.get(&n) else {
                continue;
            };
            'maps: for &m in list.iter().rev().take(MAP_SCAN) {
                let mp = self.map(m);
                if self.lives && !mp.pages.iter().all(|&p| self.life_ok(p)) {
                    continue;
                }
                let off = if n == 1 {
                    // a gap between pinned blocks of the page
                    let pg = self.page(mp.pages[0]);
                    let mut prev_end = 0u64;
                    let mut found = None;
                    for (&s, &(e, a)) in &pg.occ {
                        if !pinned(a) {
                            continue;
                        }
                        if s >= prev_end + size {
                            found = Some(prev_end);
                            break;
                        }
                        prev_end = prev_end.max(e);
                    }
                    if found.is_none() && g >= prev_end + size {
                        found = Some(prev_end);
                    }
                    match found {
                        Some(o) => o,
                        None => continue,
                    }
                } else {
                    for &p in &mp.pages[1..n - 1] {
                        if self.page(p).occ.values().any(|&(_, a)| pinned(a)) {
                            continue 'maps;
                        }
                    }
                    let head = self.page(mp.pages[0]);
                    let live_end = head
                        .occ
                        .iter()
                        .filter(|(_, (_, a))| pinned(*a))
                        .map(|(_, &(e, _))| e)
                        .max()
                        .unwrap_or(0);
                    let tail = self.page(mp.pages[n - 1]);
                    let live_start = tail
                        .occ
                        .iter()
                        .find(|(_, (_, a))| pinned(*a))
                        .map(|(&s, _)| s)
                        .unwrap_or(g);
                    let n = n as u64;
                    let lo = round_up(live_end.max(((n - 1) * g + 1).saturating_sub(size)), ALIGN);
                    let Some(top) = ((n - 1) * g + live_start).checked_sub(size) else {
                        continue;
                    };
                    let hi = (g - 1).min(top);
                    if lo > hi {
                        continue;
                    }
                    lo
                };
                let mut victims = Vec::new();
                for (p, s, e) in self.pieces(&mp.pages, off, size) {
                    for (_, &(oe, a)) in self.page(p).occ.range(..e) {
                        if oe > s && !victims.contains(&a) {
                            victims.push(a);
                        }
                    }
                }
                return Some((m, off, victims));
            }
        }
        None
    }

    /// Best-fit gap of at least `size` bytes between pinned (live or pending) blocks of a
    /// small page: `(mapping, offset, cached blocks to dissolve)`.
    pub(super) fn reuse_small(&self, size: u64) -> Option<(u32, u64, Vec<u64>)> {
        let g = self.gran;
        let pinned = |a: u64| {
            self.blocks
                .get(a)
                .is_some_and(|b| b.state != BState::Cached)
        };
        let mut best: Option<(u64, u32, u64)> = None; // (gap len, page, offset)
        for &p in &self.small_pages {
            if !self.life_ok(p) {
                continue;
            }
            let pg = self.page(p);
            let mut prev_end = 0u64;
            let consider = |s: u64, e: u64, best: &mut Option<(u64, u32, u64)>| {
                if e >= s + size {
                    let len = e - s;
                    // keep a free prefix whole: place at its end
                    let pos = if s == 0 && e < g { e - size } else { s };
                    if best.is_none_or(|b| len < b.0) {
                        *best = Some((len, p, pos));
                    }
                }
            };
            for (&s, &(e, a)) in &pg.occ {
                if !pinned(a) {
                    continue;
                }
                consider(prev_end, s, &mut best);
                prev_end = prev_end.max(e);
            }
            consider(prev_end, g, &mut best);
        }
        let (_, p, pos) = best?;
        let m = *self.page(p).maps.first()?;
        let idx = self.map(m).pages.iter().position(|&q| q == p)? as u64;
        let mut victims = Vec::new();
        for (_, &(oe, a)) in self.page(p).occ.range(..pos + size) {
            if oe > pos && !victims.contains(&a) {
                victims.push(a);
            }
        }
        Some((m, idx * g + pos, victims))
    }

    /// Offset at which `size` bytes fit in mapping `m` spanning all its pages, if any.
    pub(super) fn fit_in_mapping(&self, m: u32, size: u64, classes: &[usize]) -> Option<u64> {
        let g = self.gran;
        let mp = self.map(m);
        let n = mp.pages.len() as u64;
        if n < 2 {
            return None;
        }
        let ends = [mp.pages[0], mp.pages[n as usize - 1]];
        if ends.iter().any(|&p| !self.life_ok(p)) {
            return None;
        }
        if ends.iter().any(|&p| {
            let pg = self.page(p);
            pg.used != 0 && !classes.contains(&pg.class)
        }) {
            return None;
        }
        for &p in &mp.pages[1..mp.pages.len() - 1] {
            if self.page(p).used != 0 {
                return None;
            }
        }
        let sf = self.free_suffix(mp.pages[0]);
        let pf = self.free_prefix(mp.pages[n as usize - 1]);
        let lo = (g - sf).max(((n - 1) * g + 1).saturating_sub(size));
        let lo = round_up(lo, ALIGN);
        let hi = (g - 1).min(((n - 1) * g + pf).checked_sub(size)?);
        (lo <= hi).then_some(lo)
    }
}

impl Stitch {
    /// Carve `size` bytes out of any mapping held (of at least the pages `size` spans): a
    /// window of its address range that no live or pending block touches, and, unless
    /// `victims_ok`, no cached block either. Of the candidate windows it takes the one whose
    /// cached blocks hold the fewest bytes, then the tightest. Returns `(mapping, offset,
    /// cached blocks to dissolve)`. No driver call: mappings alias pages, so a window is made
    /// of bytes the pool holds already, whichever mapping they were first used through.
    pub(super) fn carve(&self, size: u64, victims_ok: bool) -> Option<(u32, u64, Vec<u64>)> {
        let g = self.gran;
        let n_min = size.div_ceil(g) as usize;
        let blocked = |a: u64| {
            self.blocks
                .get(a)
                .is_some_and(|b| !victims_ok || b.state != BState::Cached)
        };
        // candidate gaps: (mapping, start, end)
        let mut gaps: Vec<(u32, u64, u64)> = Vec::new();
        let mut lens: Vec<usize> = self
            .maps_by_len
            .iter()
            .filter(|(n, l)| **n >= n_min && !l.is_empty())
            .map(|(n, _)| *n)
            .collect();
        lens.sort_unstable();
        for n in lens {
            for &m in self.maps_by_len[&n].iter().rev().take(CARVE_SCAN) {
                let mp = self.map(m);
                let mut prev_end = 0u64;
                let mut consider = |s: u64, e: u64| {
                    if e >= s + size {
                        gaps.push((m, s, e));
                    }
                };
                for (i, &p) in mp.pages.iter().enumerate() {
                    let base = i as u64 * g;
                    for (&s, &(e, a)) in &self.page(p).occ {
                        if !blocked(a) {
                            continue;
                        }
                        consider(prev_end, base + s);
                        prev_end = prev_end.max(base + e);
                    }
                }
                consider(prev_end, n as u64 * g);
            }
            if gaps.len() >= CARVE_SCAN {
                break;
            }
        }
        // with the shape guard on, windows clear of much larger blocks' places come first
        let guard = self.guarded(size);
        // (touches the guard, victim bytes, gap length, mapping, offset, victims)
        let mut best: Option<(bool, u64, u64, u32, u64, Vec<u64>)> = None;
        for (m, s, e) in gaps {
            for off in [s, e - size] {
                if !self.window_life_ok(m, off, size) {
                    continue;
                }
                let (bytes, victims) = if victims_ok {
                    self.victims_at(m, off, size)
                } else {
                    (0, Vec::new())
                };
                let touches = self.touches_guard(&guard, m, off, size);
                if best
                    .as_ref()
                    .is_none_or(|b| (touches, bytes, e - s) < (b.0, b.1, b.2))
                {
                    best = Some((touches, bytes, e - s, m, off, victims));
                }
                if !victims_ok && guard.is_empty() {
                    break;
                }
            }
        }
        best.map(|(_, _, _, m, off, v)| (m, off, v))
    }

    /// Diagnostics (`examples/pool_handles.rs`): of the mappings held that span at least the
    /// pages of `size`, how many there are, how many have a window of `size` bytes that no
    /// live or pending block touches (carved once cached blocks are dissolved), and how many
    /// one that no block at all touches.
    #[doc(hidden)]
    pub fn carve_view(&self, size: u64) -> (usize, usize, usize) {
        let g = self.gran;
        let n_min = size.div_ceil(g) as usize;
        let (mut long, mut pinned_free, mut all_free) = (0, 0, 0);
        for mp in self.maps.iter().flatten() {
            if mp.pages.len() < n_min {
                continue;
            }
            long += 1;
            let fits = |cached_blocks: bool| {
                let mut prev_end = 0u64;
                for (i, &p) in mp.pages.iter().enumerate() {
                    let base = i as u64 * g;
                    for (&s, &(e, a)) in &self.page(p).occ {
                        let blocks = self
                            .blocks
                            .get(a)
                            .is_some_and(|b| cached_blocks || b.state != BState::Cached);
                        if !blocks {
                            continue;
                        }
                        if base + s >= prev_end + size {
                            return true;
                        }
                        prev_end = prev_end.max(base + e);
                    }
                }
                mp.pages.len() as u64 * g >= prev_end + size
            };
            if fits(false) {
                pinned_free += 1;
            }
            if fits(true) {
                all_free += 1;
            }
        }
        (long, pinned_free, all_free)
    }

    /// Cached blocks overlapping `[off, off + size)` of mapping `m`, and their bytes.
    fn victims_at(&self, m: u32, off: u64, size: u64) -> (u64, Vec<u64>) {
        let mut victims = Vec::new();
        let mut bytes = 0;
        for (p, s, e) in self.pieces(&self.map(m).pages, off, size) {
            for (_, &(oe, a)) in self.page(p).occ.range(..e) {
                if oe > s && !victims.contains(&a) {
                    victims.push(a);
                    bytes += self.blocks.get(a).map_or(0, |b| b.size);
                }
            }
        }
        (bytes, victims)
    }
}

/// How many earlier places of one size are remembered.
const GHOSTS: usize = 32;

impl Stitch {
    pub(super) fn note_ghost(&mut self, size: u64, m: u32, off: u64) {
        let va = self.map(m).va;
        let v = self.ghosts.entry(size).or_default();
        v.retain(|&(gm, gva, goff)| !(gm == m && gva == va && goff == off));
        if v.len() >= GHOSTS {
            v.remove(0);
        }
        v.push((m, va, off));
    }

    /// An earlier place of a block of `size` that no live or pending block touches now (and,
    /// unless `victims_ok`, no cached block): `(mapping, offset, cached blocks to dissolve)`.
    /// A repeating pattern of shapes (the layers of a model) then keeps one layout: each
    /// block goes where its twin went in the previous round, which fitted with the same
    /// blocks live, and no new mapping is made.
    pub(super) fn ghost(&self, size: u64, victims_ok: bool) -> Option<(u32, u64, Vec<u64>)> {
        let v = self.ghosts.get(&size)?;
        // with the shape guard on, an earlier place clear of much larger blocks' places comes
        // first (see `guard`); the latest one touching them is kept for want of another
        let guard = self.guarded(size);
        let mut fallback = None;
        'ghosts: for &(m, va, off) in v.iter().rev() {
            let Some(Some(mp)) = self.maps.get(m as usize) else {
                continue;
            };
            if mp.va != va || off + size > mp.pages.len() as u64 * self.gran {
                continue;
            }
            let mut victims = Vec::new();
            for (p, s, e) in self.pieces(&mp.pages, off, size) {
                for (_, &(oe, a)) in self.page(p).occ.range(..e) {
                    if oe <= s {
                        continue;
                    }
                    let cached = self
                        .blocks
                        .get(a)
                        .is_some_and(|b| b.state == BState::Cached);
                    if !cached || !victims_ok {
                        continue 'ghosts;
                    }
                    if !victims.contains(&a) {
                        victims.push(a);
                    }
                }
            }
            if !self.window_life_ok(m, off, size) {
                continue;
            }
            if self.touches_guard(&guard, m, off, size) {
                fallback = fallback.or(Some((m, off, victims)));
                continue;
            }
            return Some((m, off, victims));
        }
        fallback
    }
}

/// Exactly `k` whole free pages not of the runs named (by their first page), or None (see
/// `take_free_pages`).
pub(super) type TakeFree<'a> = dyn Fn(u64, &[u32]) -> Option<Vec<u32>> + 'a;

/// A free end of a handle: its free bytes there and the handle's pages in order.
type End = (u64, Vec<u32>);

/// A plan of `run_ends_plan`: (head index + 1, tail index + 1, whole pages between them,
/// free end bytes left outside the block).
type Combo = (usize, usize, u64, u64);

/// Handles sized per request: how many run ends the placement looks at.
const RUN_ENDS: usize = 16;

impl Stitch {
    /// Free bytes at the end (`suffix`) or the start of run `run` (its pages in order),
    /// across its pages: whole free pages and the free end of the first used one.
    fn run_free_end(&self, run: &[u32], suffix: bool) -> u64 {
        let g = self.gran;
        let mut bytes = 0;
        let order: Box<dyn Iterator<Item = &u32>> = if suffix {
            Box::new(run.iter().rev())
        } else {
            Box::new(run.iter())
        };
        for &p in order {
            if self.page(p).used == 0 {
                bytes += g;
                continue;
            }
            bytes += if suffix {
                self.free_suffix(p)
            } else {
                self.free_prefix(p)
            };
            break;
        }
        bytes
    }

    /// Handles sized per request (`Shapes::Request` / `Pow2`): a new mapping of whole
    /// handles whose block starts in the free end of a run or page (its head), goes on over
    /// whole free pages and ends in the free start of another (its tail), the ends spanning
    /// several pages of a run where they are free (a run with no byte used is all end). A
    /// handle is mapped only whole: the head's and tail's other pages are mapped too,
    /// outside the block, and keep the blocks they hold. Of the plans whose whole free pages
    /// `take_free` gives, the one mapping the fewest handles (one map each), then leaving
    /// the least of its ends' free bytes outside the block, then taking the fewest whole
    /// pages. `need_only`: no plan is made; the fewest pages any plan lacks (what growth
    /// creates), as `Plan::New { pages: [], off: that count }`.
    pub(super) fn run_ends_plan(&self, size: u64, take_free: &TakeFree) -> Option<Plan> {
        let g = self.gran;
        let (heads, tails, combos) = self.run_ends(size);
        let handles_of = |pages: &[u32]| {
            let mut n = 0;
            let mut i = 0;
            while i < pages.len() {
                i += self.page(pages[i]).run.max(1) as usize;
                n += 1;
            }
            n
        };
        // (handles, free end bytes left, whole pages, pages, offset)
        let mut best: Option<(usize, u64, u64, Vec<u32>, u64)> = None;
        for (hi, ti, m, left) in combos {
            // no end: the usual placement (`place_pages`), which packs the remainder tighter
            if hi == 0 && ti == 0 {
                continue;
            }
            let not = ends_of(&heads, &tails, hi, ti);
            let Some(middle) = take_free(m, &not) else {
                continue;
            };
            let mut pages: Vec<u32> = Vec::new();
            let mut off = 0;
            if hi > 0 {
                let (sh, hp) = &heads[hi - 1];
                pages.extend_from_slice(hp);
                off = hp.len() as u64 * g - (*sh).min(size);
                if self.faults.run_end_over_live && off >= ALIGN {
                    off -= ALIGN;
                }
            }
            pages.extend(middle);
            if ti > 0 {
                pages.extend_from_slice(&tails[ti - 1].1);
            }
            let n = handles_of(&pages);
            if best.as_ref().is_none_or(|b| (n, left, m) < (b.0, b.1, b.2)) {
                best = Some((n, left, m, pages, off));
            }
        }
        let (_, _, _, pages, off) = best?;
        Some(Plan::New { pages, off })
    }

    /// What growth creates for `size` bytes with handles sized per request (see
    /// `run_ends_plan`): `(pages lacking, whole pages)` of the plan lacking the fewest (then
    /// taking the fewest). A run of the whole pages alone always completes that plan.
    pub(super) fn run_ends_need(
        &self,
        size: u64,
        split: &dyn Fn(u64) -> Vec<u64>,
    ) -> Option<(u64, u64)> {
        let (heads, tails, combos) = self.run_ends(size);
        let singles = self.free_pages.len() as u64;
        let runs = self.free_runs();
        combos
            .iter()
            .map(|&(hi, ti, m, _)| {
                let not = ends_of(&heads, &tails, hi, ti);
                let lens: Vec<u64> = runs
                    .iter()
                    .filter(|r| !not.contains(&r[0]))
                    .map(|r| r.len() as u64)
                    .collect();
                // the fewest new pages with which `take_free_pages` gives the middle
                let lack = (0..=m)
                    .find(|&x| {
                        let mut all = lens.clone();
                        all.extend(split(x).into_iter().filter(|&k| k > 1));
                        let new_singles = split(x).iter().filter(|&&k| k == 1).count() as u64;
                        fills(m, &mut all, singles + new_singles)
                    })
                    .unwrap_or(m);
                (lack, m)
            })
            .min()
    }

    /// The heads and tails `run_ends_plan` looks at and their combinations: (head index + 1,
    /// tail index + 1, whole pages between them, free end bytes left outside the block).
    fn run_ends(&self, size: u64) -> (Vec<End>, Vec<End>, Vec<Combo>) {
        let g = self.gran;
        // ends: (free bytes, the handle's pages in order)
        let mut heads: Vec<End> = Vec::new();
        let mut tails: Vec<End> = Vec::new();
        for run in self.runs.values() {
            if !run.iter().all(|&q| self.life_ok(q)) {
                continue;
            }
            let s = self.run_free_end(run, true);
            if s > 0 {
                heads.push((s, run.clone()));
            }
            let p = self.run_free_end(run, false);
            if p > 0 {
                tails.push((p, run.clone()));
            }
        }
        for &(len, p) in self.suffix[LARGE].iter().rev().take(RUN_ENDS) {
            if self.page(p).run <= 1 && self.life_ok(p) {
                heads.push((len, vec![p]));
            }
        }
        for &(len, p) in self.prefix[LARGE].iter().rev().take(RUN_ENDS) {
            if self.page(p).run <= 1 && self.life_ok(p) {
                tails.push((len, vec![p]));
            }
        }
        heads.sort_by(|a, b| b.0.cmp(&a.0).then(a.1[0].cmp(&b.1[0])));
        tails.sort_by(|a, b| b.0.cmp(&a.0).then(a.1[0].cmp(&b.1[0])));
        heads.truncate(RUN_ENDS);
        tails.truncate(RUN_ENDS);
        // combinations: (head index + 1, tail index + 1, whole pages, free end bytes left)
        let mut combos: Vec<Combo> = Vec::new();
        let no_end = (0u64, Vec::new());
        for (hi, (sh, hp)) in std::iter::once(&no_end).chain(heads.iter()).enumerate() {
            let used_h = (*sh).min(size);
            let rest = size - used_h;
            if rest == 0 {
                combos.push((hi, 0, 0, sh - used_h));
                continue;
            }
            // no tail: the last whole page is partly used
            combos.push((hi, 0, rest.div_ceil(g), 0));
            for (ti, (pt, tp)) in tails.iter().enumerate() {
                if !hp.is_empty() && hp[0] == tp[0] {
                    continue;
                }
                let m = rest.saturating_sub(*pt).div_ceil(g);
                // the tail then holds the last `rest - m * g` bytes (more than none)
                if rest <= m * g {
                    continue;
                }
                combos.push((hi, ti + 1, m, pt - (rest - m * g)));
            }
        }
        (heads, tails, combos)
    }
}

/// The runs (named by their first page) a plan's ends take: not whole free pages of its
/// middle.
fn ends_of(heads: &[(u64, Vec<u32>)], tails: &[(u64, Vec<u32>)], hi: usize, ti: usize) -> Vec<u32> {
    let mut not: Vec<u32> = Vec::new();
    if hi > 0 {
        not.push(heads[hi - 1].1[0]);
    }
    if ti > 0 {
        not.push(tails[ti - 1].1[0]);
    }
    not
}

/// Whether `take_free_pages` (handles sized per request) makes exactly `k` whole pages out
/// of free runs of lengths `runs` and `singles` pages with a handle of their own.
fn fills(k: u64, runs: &mut [u64], singles: u64) -> bool {
    // longest first, as `free_runs` orders them
    runs.sort_unstable_by(|a, b| b.cmp(a));
    let mut got = 0;
    for &r in runs.iter() {
        if got + r <= k {
            got += r;
        }
    }
    if singles >= k - got {
        return true;
    }
    // the fallback: pages of their own first, then runs that fit
    let mut got = singles.min(k);
    for &r in runs.iter() {
        if got == k {
            break;
        }
        if r <= k - got {
            got += r;
        }
    }
    got == k
}
