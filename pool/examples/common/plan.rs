//! The offline plan of a trace in one address range: every block's lifetime known, blocks
//! placed greedy by size (largest first, each at the lowest best-fitting gap among the placed
//! blocks whose lifetimes overlap it). Not reachable online; it shows how small one range that
//! is never stitched can be, which best fit grown at its end is not.

use std::collections::HashMap;
use vramshim_pool::replay::Event;
use vramshim_pool::{ALIGN, MIB};

/// The driver's page: the unit a range grows by.
pub const PAGE: u64 = 2 * MIB;

/// One allocation of a trace: its event index, its free's event index (the trace's length if
/// never freed), its size in `ALIGN` units, and its requested size.
#[derive(Clone, Copy)]
pub struct Block {
    pub at: usize,
    pub until: usize,
    pub len: u64,
    pub size: u64,
}

/// The blocks of `events` in allocation order.
pub fn blocks(events: &[Event]) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    let mut open: HashMap<u64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match *e {
            Event::Alloc { id, size, .. } => {
                open.insert(id, out.len());
                out.push(Block {
                    at: i,
                    until: events.len(),
                    len: size.max(1).div_ceil(ALIGN) * ALIGN,
                    size,
                });
            }
            Event::Free { id, .. } => {
                if let Some(b) = open.remove(&id) {
                    out[b].until = i;
                }
            }
            Event::ProcessSync | Event::StreamRetired { .. } => {}
        }
    }
    out
}

/// The extent (bytes) of the offline greedy-by-size plan of `blocks` in one range.
pub fn offline(blocks: &[Block]) -> u64 {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    // Equal sizes in the order they are freed: the greedy is sensitive to ties (bert's plan
    // is 1.053 x peak live this way, 1.160 with ties in allocation order); any order gives a
    // valid plan.
    order.sort_by_key(|&i| (std::cmp::Reverse(blocks[i].len), blocks[i].until, i));
    // placed blocks: (offset, end, at, until)
    let mut placed: Vec<(u64, u64, usize, usize)> = Vec::with_capacity(blocks.len());
    let mut extent = 0u64;
    let mut near: Vec<(u64, u64)> = Vec::new();
    for i in order {
        let b = blocks[i];
        near.clear();
        near.extend(
            placed
                .iter()
                .filter(|p| p.2 < b.until && b.at < p.3)
                .map(|p| (p.0, p.1)),
        );
        near.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        let mut prev = 0u64;
        for &(o, e) in &near {
            if o >= prev {
                let gap = o - prev;
                if gap >= b.len && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, prev));
                }
            }
            prev = prev.max(e);
        }
        let off = best.map_or(prev, |(_, o)| o);
        placed.push((off, off + b.len, b.at, b.until));
        extent = extent.max(off + b.len);
    }
    assert_eq!(
        overlap(&mut placed),
        None,
        "the offline plan overlaps two live blocks"
    );
    extent
}

/// Two planned blocks `(offset, end, at, until)` that share bytes while both are live, if
/// any (the plan's one safety property).
fn overlap(placed: &mut [(u64, u64, usize, usize)]) -> Option<(usize, usize)> {
    placed.sort_unstable();
    for i in 0..placed.len() {
        let a = placed[i];
        for (j, b) in placed.iter().enumerate().skip(i + 1) {
            if b.0 >= a.1 {
                break;
            }
            if a.2 < b.3 && b.2 < a.3 {
                return Some((i, j));
            }
        }
    }
    None
}
