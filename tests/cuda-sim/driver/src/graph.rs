//! Graphs made by stream capture, and their memory nodes.
//!
//! A stream-ordered allocation on a capturing stream (`cuMemAllocAsync`, `cudaMallocAsync`)
//! becomes an allocation node, as in CUDA: its address is fixed when the node is made and
//! stays the same for every launch of the graph; the allocation's lifetime begins when a
//! launch reaches the node and ends at a free node of the same graph, at a stream-ordered
//! free (`cuMemFreeAsync`) or a `cuMemFree` outside it, or at the next launch of a graph
//! instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`. A stream-ordered free
//! on a capturing stream of a graph allocation becomes a free node; of any other memory it is
//! refused, the capture going on (`exports::pool`). An allocation freed in its
//! own graph cannot be freed outside it; one not freed must be freed before the graph is
//! launched again (else the launch fails with `CUDA_ERROR_INVALID_VALUE`) unless the graph
//! frees it on launch. Destroying a graph frees no live allocation.
//!
//! Simplifications: a node's memory is backed (and charged to the device) from the node's
//! creation until neither its graph nor an executable graph made from it exists and no launch's
//! allocation of it is live (CUDA maps it at launch and keeps it for graphs until
//! `cuDeviceGraphMemTrim`); lifetimes follow the order of the API calls (launch, free), not the
//! GPU's; the other captured work (kernels, copies) is not run at launch, as it is not run
//! during capture.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use crate::abi::*;
use crate::mem::{self, Kind};
use crate::stream::Stream;

const GRAPH_BASE: usize = 0x7c9a_0000_0000;
const EXEC_BASE: usize = 0x7c9b_0000_0000;
/// Graphs made by `cuGraphCreate`.
const CREATED_BASE: usize = 0x7c9c_0000_0000;
const STEP: usize = 0x100;

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
pub const AUTO_FREE_ON_LAUNCH: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Alloc(u64),
    Free(u64),
}

/// One allocation node's memory.
struct GraphAlloc {
    dev: i32,
    size: u64,
    /// The capture that made the node (its graph's id once ended).
    capture: u64,
    /// A free node of its own graph frees it: it cannot be freed outside.
    freed_in_graph: bool,
    /// A launch's allocation is live (allocated and not freed).
    live: bool,
    /// Its graph and the executable graphs made from it that exist.
    holders: u32,
}

struct Exec {
    nodes: Vec<Node>,
    auto_free: bool,
}

#[derive(Default)]
struct Graphs {
    /// Nodes of captures under way, by capture id.
    building: HashMap<u64, Vec<Node>>,
    /// Ended captures' nodes, by graph handle.
    graphs: HashMap<usize, (u64, Vec<Node>)>,
    execs: HashMap<usize, Exec>,
    next_exec: usize,
    allocs: HashMap<u64, GraphAlloc>,
    /// Per device: bytes live in launches now and at most (graph memory "used"), and bytes
    /// backing allocation nodes now and at most ("reserved").
    used: HashMap<i32, (u64, u64)>,
    reserved: HashMap<i32, (u64, u64)>,
}

static G: LazyLock<Mutex<Graphs>> = LazyLock::new(|| Mutex::new(Graphs::default()));

fn g() -> MutexGuard<'static, Graphs> {
    G.lock().unwrap_or_else(|e| e.into_inner())
}

fn add(m: &mut HashMap<i32, (u64, u64)>, dev: i32, n: u64) {
    let e = m.entry(dev).or_default();
    e.0 += n;
    e.1 = e.1.max(e.0);
}

fn sub(m: &mut HashMap<i32, (u64, u64)>, dev: i32, n: u64) {
    let e = m.entry(dev).or_default();
    e.0 = e.0.saturating_sub(n);
}

impl Graphs {
    fn set_live(&mut self, ptr: u64, live: bool) {
        if let Some(a) = self.allocs.get_mut(&ptr)
            && a.live != live
        {
            a.live = live;
            let (dev, size) = (a.dev, a.size);
            if live {
                add(&mut self.used, dev, size);
            } else {
                sub(&mut self.used, dev, size);
            }
        }
    }

    /// The node's memory goes once nothing holds it and no launch's allocation is live.
    fn release_if_unheld(&mut self, ptr: u64) {
        if self
            .allocs
            .get(&ptr)
            .is_some_and(|a| a.holders == 0 && !a.live)
            && let Some(a) = self.allocs.remove(&ptr)
        {
            sub(&mut self.reserved, a.dev, a.size);
            let _ = mem::free(ptr, |k| k == Kind::Graph);
        }
    }

    fn hold(&mut self, nodes: &[Node], by: i32) {
        for n in nodes {
            if let Node::Alloc(p) = n
                && let Some(a) = self.allocs.get_mut(p)
            {
                a.holders = a.holders.saturating_add_signed(by);
            }
        }
        if by < 0 {
            for n in nodes {
                if let Node::Alloc(p) = n {
                    self.release_if_unheld(*p);
                }
            }
        }
    }
}

/// Whether `ptr` is the address of an allocation node's memory.
pub fn is_graph_alloc(ptr: u64) -> bool {
    g().allocs.contains_key(&ptr)
}

/// `cuMemAllocAsync` on a stream capturing as capture `capture`: an allocation node.
pub fn capture_alloc(capture: u64, dev: i32, size: u64) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = mem::alloc(dev, size, Kind::Graph)?;
    let mut g = g();
    g.allocs.insert(
        ptr,
        GraphAlloc {
            dev,
            size,
            capture,
            freed_in_graph: false,
            live: false,
            holders: 0,
        },
    );
    add(&mut g.reserved, dev, size);
    g.building
        .entry(capture)
        .or_default()
        .push(Node::Alloc(ptr));
    Ok(ptr)
}

/// `cuMemFreeAsync` of a graph allocation on a stream capturing as capture `capture`: a free
/// node (of its own graph, or of another graph for an allocation a launch left live).
pub fn capture_free(capture: u64, ptr: u64) -> Res {
    let mut g = g();
    let Some(a) = g.allocs.get_mut(&ptr) else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    if a.freed_in_graph {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if a.capture == capture {
        a.freed_in_graph = true;
    } else if !a.live {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    g.building.entry(capture).or_default().push(Node::Free(ptr));
    Ok(())
}

/// `cuGraphCreate`: an empty graph (to capture into, `cuStreamBeginCaptureToGraph`).
pub fn create() -> CUgraph {
    let mut g = g();
    g.next_exec += 1;
    let h = CREATED_BASE + g.next_exec * STEP;
    g.graphs.insert(h, (0, Vec::new()));
    h as CUgraph
}

/// Whether `graph` is a graph that exists.
pub fn exists(graph: CUgraph) -> bool {
    g().graphs.contains_key(&(graph as usize))
}

/// A capture ended: its nodes become a new graph's, or are added to graph `into` (a capture
/// begun by `cuStreamBeginCaptureToGraph`), when `valid`; else they go with it (the graph
/// captured into keeps what it had).
pub fn capture_ended(capture: u64, valid: bool, into: usize) -> *mut std::ffi::c_void {
    let mut g = g();
    let nodes = g.building.remove(&capture).unwrap_or_default();
    if !valid {
        for n in &nodes {
            if let Node::Alloc(p) = n {
                g.release_if_unheld(*p);
            }
        }
        return std::ptr::null_mut();
    }
    g.hold(&nodes, 1);
    if into != 0
        && let Some((_, existing)) = g.graphs.get_mut(&into)
    {
        existing.extend(nodes);
        return into as *mut std::ffi::c_void;
    }
    let handle = GRAPH_BASE + capture as usize * STEP;
    g.graphs.insert(handle, (capture, nodes));
    handle as *mut std::ffi::c_void
}

/// `cuGraphDestroy`: its allocation nodes' memory goes once no executable graph holds it (a
/// live allocation stays until freed).
pub fn destroy(graph: CUgraph) -> Res {
    let mut g = g();
    let (_, nodes) = g
        .graphs
        .remove(&(graph as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    g.hold(&nodes, -1);
    Ok(())
}

/// `cuGraphInstantiateWithFlags`.
pub fn instantiate(graph: CUgraph, flags: u64) -> Result<CUgraphExec, CUresult> {
    if flags & !(AUTO_FREE_ON_LAUNCH | 2 | 4 | 8 | 16) != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = g();
    let nodes = g
        .graphs
        .get(&(graph as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .1
        .clone();
    g.hold(&nodes, 1);
    g.next_exec += 1;
    let h = EXEC_BASE + g.next_exec * STEP;
    g.execs.insert(
        h,
        Exec {
            nodes,
            auto_free: flags & AUTO_FREE_ON_LAUNCH != 0,
        },
    );
    Ok(h as CUgraphExec)
}

/// `cuGraphExecDestroy`.
pub fn exec_destroy(exec: CUgraphExec) -> Res {
    let mut g = g();
    let e = g
        .execs
        .remove(&(exec as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    g.hold(&e.nodes, -1);
    Ok(())
}

/// `cuGraphLaunch` on `s`: the allocation nodes' allocations begin, the free nodes end theirs.
/// Refused when an allocation of an earlier launch is still live (unless the graph frees it
/// on launch).
pub fn launch(exec: CUgraphExec, s: &Arc<Stream>) -> Res {
    let mut g = g();
    let e = g
        .execs
        .get(&(exec as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (nodes, auto_free) = (e.nodes.clone(), e.auto_free);
    for n in &nodes {
        if let Node::Alloc(p) = n
            && g.allocs.get(p).is_some_and(|a| a.live)
            && !auto_free
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    for n in &nodes {
        match *n {
            Node::Alloc(p) => g.set_live(p, true),
            Node::Free(p) => {
                g.set_live(p, false);
                g.release_if_unheld(p);
            }
        }
    }
    drop(g);
    // The launch is one operation of the stream (captured, on a capturing one).
    s.submit(Vec::new(), Duration::ZERO, Box::new(|| {}));
    Ok(())
}

/// A graph allocation freed outside a graph (`cuMemFreeAsync` on a stream that does not
/// capture, or `cuMemFree`): its lifetime ends; refused for one its graph frees, or one not
/// live.
pub fn free_outside(ptr: u64) -> Res {
    let mut g = g();
    match g.allocs.get(&ptr) {
        Some(a) if !a.freed_in_graph && a.live => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    g.set_live(ptr, false);
    g.release_if_unheld(ptr);
    Ok(())
}

/// `cuDeviceGetGraphMemAttribute`: 0 used now, 1 used at most, 2 reserved now, 3 reserved at
/// most.
pub fn mem_attribute(dev: i32, attr: i32) -> u64 {
    let g = g();
    let (m, hi) = if attr < 2 {
        (&g.used, attr == 1)
    } else {
        (&g.reserved, attr == 3)
    };
    m.get(&dev)
        .map_or(0, |&(now, most)| if hi { most } else { now })
}

/// `cuDeviceSetGraphMemAttribute` on a high-water mark: reset to the current value.
pub fn reset_high(dev: i32, attr: i32) {
    let mut g = g();
    let m = if attr == 1 {
        &mut g.used
    } else {
        &mut g.reserved
    };
    if let Some(e) = m.get_mut(&dev) {
        e.1 = e.0;
    }
}
