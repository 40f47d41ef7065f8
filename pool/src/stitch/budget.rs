//! The budget of a tight pool: how much memory may sit cached over what the program uses,
//! and giving idle memory back.
//!
//! The budget is `recent peak live * (1 + ratio) + slack`, in whole pages. "Recent peak live"
//! is the largest live byte count over the current and the previous window of `window`
//! allocations, so a job whose use shrinks for good gets its memory back after two windows
//! while a job that repeats a pattern keeps the memory its pattern needs (and its cache).
//! The promise, checked by the property tests: whenever the pool holds more than its budget,
//! it holds no cached block, or no page it holds could be given back even with its cache
//! dissolved (every byte above the budget is in pages that live or pending blocks, or mappings
//! in use and stream conditions of this epoch, pin: dissolving would free nothing, so the
//! cache stays and serves exact repeats). So:
//! - below the budget, a request that misses the cache may grow the pool (cached blocks stay
//!   formed for exact reuse, as a caching allocator);
//! - a growth that would cross the budget first dissolves cached blocks and places the
//!   request in the bytes the pool holds (carved out of a held mapping, or free pages
//!   stitched into a new one);
//! - a free while the pool is above its budget dissolves the cache (unless that would give
//!   nothing back; a request that then misses the cache dissolves it before it is placed,
//!   so placement is as if it had been dissolved), and pages left with no
//!   byte in use are given back (unmapped and released) when no stream may still use them:
//!   after a synchronization (the process's own, like CUDA's pool release threshold, which
//!   trims at synchronizations), never by synchronizing for it.

use super::*;

/// Allocations and frees above the budget between two asks whether the streams of busy
/// mappings and page fences passed their frees (see `keep_budget`).
const SETTLE_EVERY: u64 = 64;

/// See the module documentation. `Budget::default()`: 5% over the recent peak plus 2 MiB,
/// over windows of 65536 allocations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Share of the recent peak of live bytes the pool may hold on top of it.
    pub ratio: f64,
    /// Bytes the pool may hold on top of that (keeps a tiny pool from thrashing).
    pub slack: u64,
    /// Allocations per window of the recent peak (at least 1).
    pub window: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            ratio: 0.05,
            slack: 2 * crate::MIB,
            window: 1 << 16,
        }
    }
}

impl Budget {
    /// A budget ratio as users write it: a ratio (`0.05`), a percentage (`5%`) or `off`
    /// (`Ok(None)`: no budget). `Err` names the accepted forms.
    pub fn parse_ratio(v: &str) -> Result<Option<f64>, &'static str> {
        const ACCEPTED: &str = "a ratio >= 0 such as 0.05, a percentage such as 5%, or off";
        let v = v.trim();
        if v.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let (num, scale) = match v.strip_suffix('%') {
            Some(n) => (n.trim_end(), 100.0),
            None => (v, 1.0),
        };
        match num.parse::<f64>() {
            Ok(r) if r.is_finite() && r >= 0.0 => Ok(Some(r / scale)),
            _ => Err(ACCEPTED),
        }
    }
}

impl Stitch {
    /// A tight pool: [`Budget::default`].
    pub fn tight() -> Self {
        Stitch::new().with_budget(Some(Budget::default()))
    }

    /// Hold at most a budget over the recent peak of live bytes while anything is cached
    /// (see [`Budget`]). `None` (the default of [`Stitch::new`]): cache until the device or
    /// the cap refuses.
    pub fn with_budget(mut self, budget: Option<Budget>) -> Self {
        self.budget = budget.map(|b| Budget {
            ratio: if b.ratio.is_finite() {
                b.ratio.max(0.0)
            } else {
                0.0
            },
            window: b.window.max(1),
            ..b
        });
        self.next_window = self.budget.map_or(u64::MAX, |b| b.window);
        self.refresh_budget(0);
        self
    }

    /// The budget in bytes with `extra` more live bytes than now, as the pool keeps it
    /// (u64::MAX: none, or the fault switch ignores it).
    pub(super) fn budget_limit(&self, extra: u64) -> u64 {
        if self.faults.ignore_budget {
            return u64::MAX;
        }
        self.budget_bytes(extra)
    }

    /// The budget in bytes with `extra` more live bytes than now (u64::MAX: none).
    pub(super) fn budget_bytes(&self, extra: u64) -> u64 {
        let Some(b) = self.budget else {
            return u64::MAX;
        };
        let g = self.gran.max(1);
        let peak = self
            .stats
            .recent_peak_live
            .max(self.prev_window_peak)
            .max(self.stats.live.saturating_add(extra));
        // Saturating: a replayed trace's sizes or a caller's ratio may be anything.
        let bytes = ((peak as f64 * (1.0 + b.ratio)) as u64).saturating_add(b.slack);
        // whole pages: a page is the unit the pool holds
        bytes / g * g
    }

    /// Recompute the published budget (and the free-path trigger) for `extra` more live bytes.
    pub(super) fn refresh_budget(&mut self, extra: u64) {
        self.limit_now = self.budget_limit(extra);
        let published = self.budget_bytes(extra);
        self.stats.budget = if published == u64::MAX { 0 } else { published };
        self.limit_key = if extra == 0 {
            (self.budget_peak(), self.gran)
        } else {
            (u64::MAX, 0)
        };
    }

    /// The peak of live bytes the budget is computed over (with no extra bytes).
    #[inline]
    fn budget_peak(&self) -> u64 {
        self.stats
            .recent_peak_live
            .max(self.prev_window_peak)
            .max(self.stats.live)
    }

    /// After an allocation under a budget that found the pool holding `before` bytes: the
    /// budget recomputed only if the peak it follows moved (the same bytes otherwise: every
    /// slow-path allocation comes here), a growth past it noted, and the budget kept.
    #[inline]
    pub(super) fn after_alloc_budget(&mut self, dev: &mut dyn Device, before: u64) {
        if self.limit_key != (self.budget_peak(), self.gran) {
            self.refresh_budget(0);
        }
        self.note_forced(before);
        // a synchronization on the way may have moved pending blocks into the cache
        if self.stats.reserved > self.limit_now {
            self.keep_budget(dev);
        }
    }

    /// After a free: roll the window, and above the budget dissolve the cache and give idle
    /// pages back.
    #[cold]
    #[inline(never)]
    pub(super) fn enforce_budget(&mut self, dev: &mut dyn Device) {
        self.roll_window();
        self.keep_budget(dev);
    }

    /// End the budget's window if a window's allocations were made in it: the peak it
    /// follows becomes the previous window's, and the pages forced past it are kept one
    /// window more.
    pub(super) fn roll_window(&mut self) {
        if self.window_allocs() >= self.next_window
            && let Some(b) = self.budget
        {
            self.prev_window_peak = self.stats.recent_peak_live;
            self.prev_forced = self.forced;
            self.forced = 0;
            self.stats.recent_peak_live = self.stats.live;
            self.next_window = self.window_allocs() + b.window;
        }
    }

    /// After an allocation that found the pool holding `before` bytes: growing past the
    /// budget means the pool was forced past it (it grows past it only when nothing else
    /// fits): remember how much, for two windows.
    pub(super) fn note_forced(&mut self, before: u64) {
        if self.stats.reserved > before && self.stats.reserved > self.limit_now {
            self.forced = self.forced.max(self.stats.reserved);
        }
    }

    /// Above the budget: dissolve every cached block and give idle pages back, unless no page
    /// could be given back even with the cache dissolved (see `release_possible`): then the
    /// cache stays, as dissolving it would free no byte of the device.
    #[cold]
    #[inline(never)]
    pub(super) fn keep_budget(&mut self, dev: &mut dyn Device) {
        self.refresh_budget(0);
        if self.stats.reserved <= self.limit_now || self.gran == 0 {
            return;
        }
        // the streams of busy mappings and page fences may have passed their frees: asked
        // (and events recorded) at most once per SETTLE_EVERY allocations and frees, each ask
        // a scan of the pool's mappings and pages
        let n = self.stats.allocs + self.stats.frees;
        if self.event_settles && self.busy_unsettled && n >= self.next_settle && !dev.is_capturing()
        {
            self.next_settle = n + SETTLE_EVERY;
            self.settle_busy(dev);
        }
        if self.ncached > 0
            && !dev.is_capturing()
            && !self.faults.dissolve_when_stuck
            && !self.release_possible()
        {
            return;
        }
        while self.ncached > 0 && self.dissolve_some(dev, u64::MAX) {}
        if !dev.is_capturing() {
            self.release_idle(dev);
        }
    }

    /// Give back wholly free pages while the pool is above its budget: the page may carry no
    /// stream condition, and each of its mappings must be unused and used by no stream any
    /// more (`map_busy`; no synchronization is made for it; the process's next one lets the
    /// rest go).
    ///
    /// A scan that finds every idle page left pinned is remembered for (epoch, `idle_gen`,
    /// pages): within one epoch a page becomes releasable only when bytes go back to it or a
    /// mapping of it is unused, dropped or re-formed (each counted in `idle_gen`), or the pool
    /// takes new pages. (Counts of free pages and mappings do not tell: an allocation that
    /// takes as many free pages as a dissolve gave back leaves the count as it was, with
    /// other pages free.)
    pub(super) fn release_idle(&mut self, dev: &mut dyn Device) {
        let key = (self.epoch, self.idle_gen, self.npages);
        if self.idle_scan == Some(key) {
            return;
        }

        // pages the pool was forced to take past its budget lately are kept (not cached
        // blocks: pages), so a workload that needs them every pass does not take and give
        // them back every pass
        let keep = self.release_keep();
        if self.stats.reserved <= keep {
            return;
        }
        let candidates: Vec<u32> = self
            .free_pages
            .iter()
            .chain(self.bound_free.iter())
            .copied()
            .collect();
        for p in candidates {
            if self.stats.reserved <= keep {
                break;
            }
            if self.pages[p as usize].is_none() || self.page(p).used != 0 {
                continue;
            }
            // a run goes back whole: every page of it idle, every mapping of them unused
            let run = self.run_of(p);
            for &q in &run {
                self.purge_fences(dev, q);
            }
            let mut maps: Vec<u32> = Vec::new();
            for &q in &run {
                for &m in &self.page(q).maps {
                    if !maps.contains(&m) {
                        maps.push(m);
                    }
                }
            }
            let movable = maps.iter().all(|&m| {
                let mp = self.map(m);
                mp.users == 0 && !self.map_busy(m)
            });
            if !movable || !self.run_all(p, |q| self.page(q).used == 0 && !self.has_active_fence(q))
            {
                continue;
            }
            let mut ok = true;
            for m in maps {
                if self.drop_mapping(dev, m).is_err() {
                    ok = false;
                    break;
                }
            }
            if !ok || self.release_page(dev, p).is_err() {
                break;
            }
            self.stats.releases += run.len() as u64;
        }
        // remembered only when the scan found every idle page left pinned: one that stopped
        // at the bytes kept left idle pages unexamined, which a lower budget (a window
        // ended since) gives back
        self.idle_scan =
            (self.stats.reserved > keep).then_some((self.epoch, self.idle_gen, self.npages));
    }

    /// The bytes `release_idle` keeps: the budget, or more while the pool was lately forced
    /// past it.
    pub(super) fn release_keep(&self) -> u64 {
        // pages the pool was forced to take past its budget lately are kept (not cached
        // blocks: pages), so a workload that needs them every pass does not take and give
        // them back every pass
        if self.faults.release_forced {
            self.limit_now
        } else {
            self.limit_now.max(self.forced.max(self.prev_forced))
        }
    }

    /// A request that found neither its cached twin nor its place of the previous round while the pool is above its budget and
    /// kept its cache (nothing could be given back): the cache is dissolved first, so the
    /// request is placed in the bytes the pool holds as if every earlier free had dissolved
    /// its block. Kept blocks serve exact repeats only; placing around them would stitch
    /// new mappings (driver calls) where their bytes would have done.
    #[cold]
    #[inline(never)]
    pub(super) fn miss_above_budget(&mut self, dev: &mut dyn Device) {
        while self.ncached > 0 && self.dissolve_some(dev, u64::MAX) {}
    }

    /// Whether `release_idle` would give back at least one page if every cached block were
    /// dissolved first. A page goes back only when no block uses a byte of it, it carries no
    /// stream condition of this epoch, and every mapping it is in is unused and used by no
    /// stream of this epoch (`map_busy`); dissolving a block freed in this epoch puts such
    /// conditions on its pages and its mapping. So a pool above its
    /// budget whose idle pages sit in a mapping that live blocks or this epoch's frees pin
    /// (the arena, between two synchronizations) gains nothing by dissolving its cache: it
    /// keeps it, and the next synchronization, growth or mapping change asks again.
    ///
    /// The answer is remembered for (epoch, epoch of the last release of pending blocks,
    /// pages, mappings, repairs, bytes kept): within one epoch, a page can only become
    /// releasable through a change of these. A block freed later in the epoch fences its
    /// pages when dissolved, a `cudaFree`d one waits for the next epoch, and new blocks only
    /// take bytes. The pending blocks of earlier epochs, though, become cached only when the
    /// pool next looks at them (`flush_pending`, at its next allocation), which may be well
    /// into the epoch a process synchronization began: their pages, pinned when the answer
    /// was remembered, may be given back once they are cached.
    fn release_possible(&mut self) -> bool {
        let keep = self.release_keep();
        if self.stats.reserved <= keep {
            return false;
        }
        let key = (
            self.epoch,
            self.flushed_epoch,
            self.npages,
            self.nmaps,
            self.repairs,
            keep,
            self.settled,
        );
        if self.stuck_key == Some(key) {
            return false;
        }
        let possible = self.releasable_page();
        if !possible {
            self.stuck_key = Some(key);
        }
        possible
    }

    /// Whether some page would be given back by `release_idle` once every cached block were
    /// dissolved (see `release_possible`), computed afresh.
    pub(super) fn releasable_page(&self) -> bool {
        let epoch = self.epoch;
        // per mapping: its cached blocks, and whether dissolving one would keep it mapped
        // (see `map_busy`); per page: cached bytes, and whether dissolving would fence it
        let mut cached_users: FxMap<u32, u32> = FxMap::default();
        let mut busy: FxMap<u32, ()> = FxMap::default();
        let mut cached_bytes: FxMap<u32, u64> = FxMap::default();
        let mut fenced: FxMap<u32, ()> = FxMap::default();
        for c in [SMALL, LARGE] {
            for &(seq, a) in &self.lru[c] {
                let Some(b) = self.blocks.get(a) else {
                    continue;
                };
                if b.state != BState::Cached || b.seq != seq {
                    continue;
                }
                *cached_users.entry(b.map).or_default() += 1;
                if b.epoch >= epoch {
                    busy.insert(b.map, ());
                }
                for (p, s, e) in self.pieces(&self.map(b.map).pages, b.off, b.size) {
                    *cached_bytes.entry(p).or_default() += e - s;
                    if b.epoch >= epoch {
                        fenced.insert(p, ());
                    }
                }
            }
        }
        let fenced_page = |p: u32| fenced.contains_key(&p) || self.has_active_fence(p);
        let movable: Vec<bool> = self
            .maps
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.as_ref().is_some_and(|mp| {
                    let m = i as u32;
                    // (the fault switch's old rule: a fenced page keeps every mapping it is in)
                    let page_rule =
                        self.faults.page_fenced_maps && mp.pages.iter().any(|&q| fenced_page(q));
                    mp.users == cached_users.get(&m).copied().unwrap_or(0)
                        && !self.map_busy(m)
                        && !busy.contains_key(&m)
                        && !page_rule
                })
            })
            .collect();
        let idle = |p: u32| {
            let pg = self.page(p);
            pg.used <= cached_bytes.get(&p).copied().unwrap_or(0)
                && !fenced_page(p)
                && pg.maps.iter().all(|&m| movable[m as usize])
        };
        // a page of a run goes back only with its whole run
        self.pages.iter().enumerate().any(|(i, pg)| {
            let p = i as u32;
            pg.is_some() && self.run_all(p, idle)
        })
    }
}
