//! This process's entry in the node registry (`vramshim_region::registry`): registered on the
//! first request, kept current by a publisher thread that copies the counters the process
//! keeps anyway (bytes in use and peak per device, refusals, failed allocations, the pool's
//! reserve, the cap), and given back at exit. Nothing is added to a request: the hot path
//! never touches the registry.
//!
//! `VRAMSHIM_REGISTRY`: `off`, or an absolute path (default `/dev/shm/vramshim-registry-<uid>`).
//! A registry that cannot be used (another user's file, a link, a foreign layout) is said in
//! one line and left alone: the process runs unregistered.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use vramshim_region::registry::{self, DeviceRecord, Identity, RegSlotIndex, Registry};
use vramshim_region::{DeviceId, ProcessKey};

use crate::state::counters;
use crate::{cap, pool};

/// How often the publisher copies the counters.
const PERIOD: Duration = Duration::from_millis(200);

static STARTED: AtomicBool = AtomicBool::new(false);
/// Set at exit, before the entry is given back: the publisher stops writing into a slot that
/// another process may take next.
static STOPPED: AtomicBool = AtomicBool::new(false);
/// A `OnceLock` a fork cannot leave waiting: only `set` (once, behind [`STARTED`]) and `get`,
/// neither of which waits; a child forked in the middle of the `set` reads none. A forked
/// child stays unregistered ([`STARTED`] is inherited): its parent made a request before the
/// fork, so CUDA was set up there, and CUDA cannot be used in such a child.
static ENTRY: OnceLock<Entry> = OnceLock::new();
/// Flags the pipeline raises between publications (e.g. waiting on a shared cap).
static FLAGS: AtomicU64 = AtomicU64::new(0);

struct Entry {
    reg: Registry,
    slot: RegSlotIndex,
    me: ProcessKey,
}

/// Where the registry is, from `VRAMSHIM_REGISTRY` (None: off or not usable, said once).
fn path() -> Option<PathBuf> {
    let v = crate::config::var("VRAMSHIM_REGISTRY").map(str::trim);
    match v {
        None | Some("") => Some(registry::default_path(euid())),
        Some("off") | Some("0") => None,
        Some(p) if p.starts_with('/') => Some(PathBuf::from(p)),
        Some(p) => {
            crate::warn!(
                "VRAMSHIM_REGISTRY={p:?} is not valid; {}; this process is not registered",
                crate::config::forms("VRAMSHIM_REGISTRY")
            );
            None
        }
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Registers this process and starts the publisher, once. Called on the cold path that
/// reads the layer switches.
pub fn start() {
    if STARTED.swap(true, Relaxed) {
        return;
    }
    let Some(path) = path() else {
        return;
    };
    let Some(me) = ProcessKey::current() else {
        return;
    };
    let reg = match Registry::open_or_create(&path) {
        Ok(r) => r,
        Err(e) => {
            crate::warn!("{e}; this process is not registered");
            return;
        }
    };
    let pid = std::process::id();
    let id = Identity {
        uid: euid(),
        start_ticks: vramshim_region::proc::stat(pid).map_or(0, |(s, _)| s),
        cmd: vramshim_region::proc::comm(pid).unwrap_or_default(),
        group: crate::config::var("VRAMSHIM_SHARED")
            .map(str::trim)
            .unwrap_or("")
            .to_string(),
        container: std::fs::read_to_string("/proc/self/cgroup")
            .map(|t| registry::parse_cgroup(&t))
            .unwrap_or_default(),
    };
    let Some(slot) = reg.register(me, &id) else {
        crate::info!(
            "node registry {} is full ({} live processes); this process is not registered",
            path.display(),
            registry::REG_SLOTS
        );
        return;
    };
    let _ = ENTRY.set(Entry { reg, slot, me });
    let spawned = std::thread::Builder::new()
        .name("vramshim-registry".into())
        .spawn(publisher);
    if let Err(e) = spawned {
        crate::warn!("node registry: cannot start the publisher thread: {e}");
    }
}

fn publisher() {
    let Some(e) = ENTRY.get() else {
        return;
    };
    let mut uuids: [Option<DeviceId>; counters::MAX_DEVICES] = [None; counters::MAX_DEVICES];
    while !STOPPED.load(Relaxed) {
        publish(e, &mut uuids);
        std::thread::sleep(PERIOD);
    }
}

fn publish(e: &Entry, uuids: &mut [Option<DeviceId>; counters::MAX_DEVICES]) {
    let mut line = 0;
    for (d, uuid) in uuids.iter_mut().enumerate() {
        let (used, peak) = (counters::live_bytes(d), counters::peak_bytes(d));
        let ordinal = d as i32;
        let (reserved, _) = pool::held(ordinal);
        if used == 0 && peak == 0 && reserved == 0 {
            continue;
        }
        if uuid.is_none() {
            *uuid = cap::device_uuid(ordinal).map(DeviceId);
        }
        e.reg.publish_device(
            e.slot,
            line,
            &DeviceRecord {
                ordinal: d as u32,
                uuid: *uuid,
                cap: cap::limit(ordinal),
                group_cap: cap::group_limit(ordinal),
                used,
                peak,
                pool_reserved: reserved,
            },
        );
        line += 1;
    }
    let waiting = if cap::waiting_now() {
        registry::FLAG_WAITING
    } else {
        0
    };
    e.reg.publish_process(
        e.slot,
        counters::cap_refusals(),
        counters::alloc_failures(),
        FLAGS.load(Relaxed) | waiting,
    );
}

/// Process exit: the entry goes (a killed process's entry reads as dead instead). A forked
/// child inherits the parent's entry but is not registered: its exit leaves the parent's.
pub fn on_exit() {
    if let Some(e) = ENTRY.get()
        && ProcessKey::current() == Some(e.me)
    {
        STOPPED.store(true, Relaxed);
        e.reg.unregister(e.slot, e.me);
    }
}
