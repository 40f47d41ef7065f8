//! Memory cap layer (owner: cap). See `docs/cap.md` for the user-facing description.
//!
//! `VRAMSHIM_CAP` (fraction, size or per-device list) bounds what the process, or with
//! `VRAMSHIM_SHARED=NAME` every process of that name together, may hold per device.
//! Everything is parsed once ([`init`], or the first call); the region of `VRAMSHIM_SHARED`
//! is attached on first use (no file is touched by a process that never uses CUDA).
//!
//! # What the interposer core calls, and when
//! - [`init`] once at load (after its environment is read): parses and reports bad values.
//! - [`try_charge`]`(device, bytes, api)` before every charged allocation (device memory of
//!   any path; never host memory). `Err(Refusal)` = answer the API's out-of-memory code (and
//!   make the runtime's last error say so); the first refusal already printed its line.
//! - [`uncharge`]`(device, bytes)` when a charged allocation is freed, or when the real call
//!   failed after a successful `try_charge`.
//! - [`adjust_meminfo`]`(device, real_free, real_total)` for `cudaMemGetInfo` /
//!   `cuMemGetInfo_v2`; [`total_for`]`(device, real_total)` for `cuDeviceTotalMem_v2` and
//!   `cudaGetDeviceProperties*().totalGlobalMem`; [`nvml_adjust`] / [`nvml_adjust_v2`] for
//!   `nvmlDeviceGetMemoryInfo` / `_v2` (device = the CUDA ordinal of the NVML handle).
//!   All are atomic loads only once set up.
//! - [`on_context_created`]`(device, free_before, free_after)` when a context is created on a
//!   device that had none in this process (driver free memory before and after), and
//!   [`on_context_destroyed`]`(device)` when it goes (`cudaDeviceReset`,
//!   `cuDevicePrimaryCtxReset`, last release). With `VRAMSHIM_CAP_CONTEXT=include` (default)
//!   the footprint counts against the cap.
//! - Nothing else: fraction caps and the device-index check ask the real driver
//!   (`cuDeviceTotalMem_v2`, `cuDeviceGetCount`, after `cuInit(0)` if needed) on first use;
//!   [`set_device_queries`] replaces those queries.
//! - [`on_fork_child`] in the atfork child handler.

pub(crate) mod config;
mod device_total;
pub(crate) mod limits;
mod member;
mod packed;
mod pages;
mod trace_config;
mod wait;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering::*};

use crate::sys::setup::{Setup, SetupCell};

use crate::cuda::{captures, driver};
use packed::{PackedGuard, PackedTable};

use vramshim_trace::footprint::{DEVICE_PAGE, Footprint, footprint, page_of};

use vramshim_region::spec::human_bytes;
use vramshim_region::{
    CapSpec, Check, DeviceId, MAX_BYTES, MAX_DEVICES, ProcessKey, Region, SlotIndex,
};
use vramshim_trace::Api;

pub(crate) use config::{ContextMode, Fault, Settings};
pub(crate) use pages::{
    charge_pool_page, charges_pool_pages, clear_pool_refusal, pool_headroom, take_pool_refusal,
    uncharge_pool_page,
};
pub(crate) use trace_config::trace_config;

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub in_use: u64,
    pub cap: u64,
}

/// How the cap learns about the devices: `total(device)` = real total memory,
/// `count()` = number of devices the process sees. `None` = not known (yet).
#[derive(Clone, Copy)]
pub(crate) struct DeviceQueries {
    pub total: fn(i32) -> Option<u64>,
    pub count: fn() -> Option<i32>,
    /// Device memory the process holds on a device per the driver's own accounting (NVML
    /// per-process use): measures the context's footprint.
    pub process_used: fn(i32) -> Option<u64>,
    /// The device's UUID: which line of a shared region counts it (processes of one group
    /// may see one device under different ordinals).
    pub uuid: fn(i32) -> Option<[u8; 16]>,
    /// `settle_pools(device, stream)`: empties the driver's memory pools of `device` of
    /// their cached blocks and says what they still cache (see `driver::settle_pools`).
    /// `None`: not done (a capture is underway, or no driver).
    pub settle_pools: fn(i32, u64) -> Option<u64>,
}

fn unknown_total(_: i32) -> Option<u64> {
    None
}
fn unknown_count() -> Option<i32> {
    None
}
fn unknown_uuid(_: i32) -> Option<[u8; 16]> {
    None
}
fn no_pools(_: i32, _: u64) -> Option<u64> {
    None
}

impl DeviceQueries {
    pub(crate) const UNKNOWN: DeviceQueries = DeviceQueries {
        total: unknown_total,
        count: unknown_count,
        process_used: unknown_total,
        uuid: unknown_uuid,
        settle_pools: no_pools,
    };
}

const UNRESOLVED: u64 = u64::MAX;
const NO_SLOT: usize = usize::MAX;
/// `lines` entries: not looked up yet / no line to be had; otherwise line + 1.
const LINE_UNKNOWN: u8 = 0;
const LINE_NONE: u8 = u8::MAX;
/// Context measurement: tries (first touches of a device) before giving up, and states.
const CTX_TRIES: u8 = 8;
const CTX_BUSY: u8 = 100;
const CTX_DONE: u8 = 255;
/// After a refusal, reclaim dead processes' slots at most this often.
const RECLAIM_EVERY_NS: u64 = 5_000_000;
/// The charge a live-table entry records for a packed (sub-page) allocation: its page is
/// charged through [`Cap::packed`] instead. Never a real charge (those are whole pages or
/// VMM sizes, or the requested bytes, which are never `u64::MAX`).
pub(crate) const PACKED_CHARGE: u64 = u64::MAX;
/// Tries at the packed-page table's lock before charging a packed allocation its own page
/// instead (over-counts, never blocks an allocation behind a busy table).
const PACKED_LOCK_TRIES: u32 = 64;

/// One cap instance (the process has one, [`global`]; tests make their own).
pub(crate) struct Cap {
    settings: Settings,
    queries: &'static OnceLock<DeviceQueries>,
    log: fn(&str),
    /// Set up on first use: true = the cap is active, false = pass-through. Not a mutex and
    /// `OnceLock`s: a child forked while another thread was setting up takes it back
    /// ([`Cap::on_fork_child`]) and sets up again, where those would block it for good.
    setup: Setup,
    /// The process that made this cap (`VRAMSHIM_CAP_FAULT=setup-pause` pauses its set-up
    /// only, not a forked child's).
    made_in: u32,
    region: SetupCell<Region>,
    spec: SetupCell<CapSpec>,
    resolved: [AtomicU64; MAX_DEVICES],
    private_used: [AtomicU64; MAX_DEVICES],
    ctx_charged: [AtomicU64; MAX_DEVICES],
    /// A context footprint measured while the cap had no room for it: charged (checked)
    /// together with the next allocation, which is refused until both fit.
    ctx_pending: [AtomicU64; MAX_DEVICES],
    /// Charges of stream-ordered allocations freed since the driver's pools were last
    /// emptied: the pool may keep their blocks cached (up to its release threshold), so the
    /// charge stays until [`Cap::settle_pool_cache`] sees the pools empty.
    pool_cached: [AtomicU64; MAX_DEVICES],
    /// Every device allocation is refused: the cap cannot be enforced as asked and
    /// `VRAMSHIM_CAP_STRICT=1` (or no slot in the shared region).
    refuse_all: AtomicBool,
    /// Live packed allocations per (device, 2 MiB page): a page is charged once, while any
    /// of them lives.
    packed: PackedTable,
    /// Context measurement per device: attempts made (0..CTX_TRIES), CTX_BUSY, or CTX_DONE.
    ctx_state: [AtomicU8; MAX_DEVICES],
    slot: AtomicUsize,
    /// The shared region's line of each CUDA ordinal (`LINE_*` or line + 1).
    lines: [AtomicU8; MAX_DEVICES],
    /// This program image (see `Region::reclaim_replaced_images`): nonzero, random.
    image: u64,
    refused_once: AtomicBool,
    slots_full_once: AtomicBool,
    last_slot_try_ns: AtomicU64,
    /// Per device: a fraction cap could not be resolved (no total memory known) and this was
    /// said once; the device runs uncapped until a total is known.
    unresolved_said: [AtomicBool; MAX_DEVICES],
    last_reclaim_ns: AtomicU64,
    /// The kernel's limit of each device (cgroup `dmem.max` of the region at its PCI
    /// address), mapped at setup; and per device whether it, not `spec`, bound the cap.
    kernel: SetupCell<Vec<Option<limits::Limit>>>,
    /// Every cgroup limit of each device, mapped with `kernel` (the trace header lists them
    /// all: a larger one than NVML's still bounds the device).
    kernel_cgroup: SetupCell<Vec<Vec<limits::Limit>>>,
    kernel_binds: [AtomicBool; MAX_DEVICES],
    /// Requests waiting for room (`VRAMSHIM_ON_CAP=wait`, see `wait`).
    waits: wait::Waits,
    /// Per device: a cap above the device's own memory was said (`device_total`).
    above_device_said: [AtomicBool; MAX_DEVICES],
    /// A group member's own caps, where they differ from the group's (`member`), and each
    /// device's in bytes where stricter than the group's (`UNRESOLVED` until asked).
    member: SetupCell<CapSpec>,
    member_resolved: [AtomicU64; MAX_DEVICES],
}

fn device_index(device: i32) -> Option<usize> {
    usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES)
}

/// A random nonzero id for this program image.
fn image_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() | 1
}

impl Cap {
    pub(crate) fn new(
        settings: Settings,
        queries: &'static OnceLock<DeviceQueries>,
        log: fn(&str),
    ) -> Cap {
        Cap {
            settings,
            queries,
            log,
            setup: Setup::new(),
            made_in: std::process::id(),
            region: SetupCell::new(),
            spec: SetupCell::new(),
            resolved: [const { AtomicU64::new(UNRESOLVED) }; MAX_DEVICES],
            private_used: [const { AtomicU64::new(0) }; MAX_DEVICES],
            ctx_charged: [const { AtomicU64::new(0) }; MAX_DEVICES],
            ctx_pending: [const { AtomicU64::new(0) }; MAX_DEVICES],
            pool_cached: [const { AtomicU64::new(0) }; MAX_DEVICES],
            refuse_all: AtomicBool::new(false),
            packed: PackedTable::new(),
            ctx_state: [const { AtomicU8::new(0) }; MAX_DEVICES],
            slot: AtomicUsize::new(NO_SLOT),
            lines: [const { AtomicU8::new(LINE_UNKNOWN) }; MAX_DEVICES],
            image: image_id(),
            refused_once: AtomicBool::new(false),
            slots_full_once: AtomicBool::new(false),
            last_slot_try_ns: AtomicU64::new(0),
            unresolved_said: [const { AtomicBool::new(false) }; MAX_DEVICES],
            last_reclaim_ns: AtomicU64::new(0),
            kernel: SetupCell::new(),
            kernel_cgroup: SetupCell::new(),
            kernel_binds: [const { AtomicBool::new(false) }; MAX_DEVICES],
            waits: wait::Waits::new(),
            above_device_said: [const { AtomicBool::new(false) }; MAX_DEVICES],
            member: SetupCell::new(),
            member_resolved: [const { AtomicU64::new(UNRESOLVED) }; MAX_DEVICES],
        }
    }

    fn queries(&self) -> DeviceQueries {
        self.queries
            .get()
            .copied()
            .unwrap_or(DeviceQueries::UNKNOWN)
    }

    /// True when the cap is active (set up on first use); false = pass-through.
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        self.setup.answer(|| self.set_up())
    }

    /// Whether the cap was set up and is active (never sets it up).
    #[inline]
    fn active(&self) -> bool {
        self.setup.is_on()
    }

    #[cold]
    fn set_up(&self) -> bool {
        self.setup.run(|| {
            if self.settings.fault == Fault::SetupPause && std::process::id() == self.made_in {
                setup_pause();
            }
            self.set_up_now()
        })
    }

    /// The set-up itself, run by one thread ([`Setup::run`]).
    fn set_up_now(&self) -> bool {
        if let Some((name, why)) = &self.settings.shared_invalid {
            return self.region_unusable(name, why);
        }
        let spec = match &self.settings.shared {
            None => self.settings.spec.clone(),
            Some((name, path)) => {
                let (region, _) = match Region::open_or_create(path, &self.settings.spec) {
                    Ok(r) => r,
                    Err(e) => return self.region_unusable(name, &e.to_string()),
                };
                let theirs = region.caps();
                self.keep_member_cap(name, &theirs, &region.cap_text());
                if let Some(me) = ProcessKey::current() {
                    self.reclaim(&region, me);
                }
                region.set_no_wake(self.settings.fault == Fault::NoWake);
                let _ = self.region.set(region);
                theirs
            }
        };
        // Only the process's own VRAMSHIM_CAP list is checked against the devices it sees:
        // other tools' per-device variables past them are ignored, as HAMi-core ignores them,
        // and a group's cap (which may come from such variables) never lifts a member's.
        if let Some(high) = spec.highest_listed()
            && self.settings.cap_text.is_some()
            && let Some(count) = (self.queries().count)()
            && high >= usize::try_from(count).unwrap_or(0)
        {
            (self.log)(&format!(
                "vramshim: VRAMSHIM_CAP=\"{}\" names device {high}, but this process sees {count} device(s) (0 to {}); {}; running without a cap (pass-through)",
                self.cap_source_text(&spec).escape_debug(),
                count - 1,
                vramshim_region::spec::CAP_FORMS
            ));
            return false;
        }
        let spec = self.with_kernel_limits(spec);
        self.announce_source(&spec);
        let _ = self.spec.set(spec);
        true
    }

    /// Maps the cgroup's dmem regions to the devices (by PCI address) and folds their hard
    /// limits into `spec`: a device the variables leave uncapped gets the kernel's limit; a
    /// capped one keeps its value, bounded by the kernel's at resolution.
    fn with_kernel_limits(&self, mut spec: CapSpec) -> CapSpec {
        let kernel = self.kernel.get_or_init(|| {
            if !self.settings.dmem.iter().any(|r| r.max.is_some()) {
                return Vec::new();
            }
            // NVML's hard limits were seen at set-up (by NVML index): ask again per CUDA
            // device, which NVML finds by PCI bus id.
            let nvml = self
                .settings
                .dmem
                .iter()
                .any(|r| r.is_nvml() && r.max.is_some());
            let count = (self.queries().count)()
                .unwrap_or(0)
                .clamp(0, MAX_DEVICES as i32);
            let (binding, cgroups): (Vec<_>, Vec<_>) = (0..count)
                .map(|d| {
                    let addr = driver::pci_bus_id(d).and_then(|b| limits::pci_addr(&b));
                    let cgroup: Vec<limits::Limit> = self
                        .settings
                        .dmem
                        .iter()
                        .filter(|r| addr.is_some() && limits::pci_addr(&r.region) == addr)
                        .filter_map(limits::DmemRegion::limit)
                        .collect();
                    let nv = nvml
                        .then(|| crate::cuda::nvml::memory_limits(d))
                        .flatten()
                        .and_then(|(_, hard)| limits::nvml_limit(d as usize, hard));
                    // The smallest; on a tie the kernel's.
                    let binding = cgroup.iter().cloned().chain(nv).min_by_key(|l| l.bytes);
                    (binding, cgroup)
                })
                .unzip();
            let _ = self.kernel_cgroup.set(cgroups);
            binding
        });
        for (d, k) in kernel.iter().enumerate() {
            if let Some(k) = k
                && spec.devices[d].is_none()
            {
                spec.devices[d] = Some(vramshim_region::CapValue::Bytes(k.bytes.max(1)));
                spec.all = false;
            }
        }
        spec
    }

    /// The kernel's limit of device `d`, if any.
    fn kernel_limit(&self, d: usize) -> Option<&limits::Limit> {
        self.kernel.get()?.get(d)?.as_ref()
    }

    /// `v` (the cap `spec` gives device `d`) bounded by the kernel's limit; remembers which
    /// bound, for messages.
    fn bounded_by_kernel(&self, d: usize, v: u64) -> u64 {
        match self.kernel_limit(d) {
            Some(k) if k.bytes < v || self.settings.origin[d].is_none() => {
                self.kernel_binds[d].store(true, Relaxed);
                k.bytes.min(v)
            }
            _ => v,
        }
    }

    /// What set device `d`'s cap, as messages name it.
    fn bound_by(&self, d: usize) -> String {
        if self.kernel_binds[d].load(Relaxed)
            && let Some(k) = self.kernel_limit(d)
        {
            return k.origin.clone();
        }
        match (&self.settings.origin[d], &self.settings.cap_text) {
            (Some(o), _) => o.clone(),
            (None, Some(t)) => format!("VRAMSHIM_CAP=\"{}\"", t.escape_debug()),
            (None, None) => "no limit".into(),
        }
    }

    /// One line, when the cap is set up, saying where it came from: at `warn` when anything
    /// but `VRAMSHIM_CAP` is involved (another tool's variable, a kernel limit, or variables
    /// that `VRAMSHIM_CAP` replaced), else at `info`.
    fn announce_source(&self, spec: &CapSpec) {
        let s = &self.settings;
        let mut parts: Vec<String> = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for (d, o) in s.origin.iter().enumerate() {
            let Some(o) = o else { continue };
            if !seen.contains(&o.as_str()) {
                seen.push(o);
                let devs: Vec<String> = s
                    .origin
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.as_deref() == Some(o.as_str()))
                    .map(|(i, _)| i.to_string())
                    .collect();
                let which = if devs.len() == MAX_DEVICES {
                    "every device".to_string()
                } else {
                    format!("device {}", devs.join(", "))
                };
                let value = spec.devices[d].map_or_else(String::new, |v| format!(" = {v}"));
                parts.push(format!("{o}{value} on {which}"));
            }
        }
        let mut kernel_said = false;
        for (d, k) in self.kernel.get().into_iter().flatten().enumerate() {
            if let Some(k) = k {
                kernel_said = true;
                parts.push(format!("{} bounds device {d}", k.origin));
            }
        }
        for r in &s.dmem {
            let mapped = self
                .kernel
                .get()
                .is_some_and(|v| v.iter().flatten().any(|k| k.origin.contains(&r.region)));
            if r.is_nvml() {
                if let Some(m) = r.min {
                    kernel_said = true;
                    parts.push(format!(
                        "NVML memory limit (soft) of NVML device {} {} (reported, not a bound)",
                        r.region.trim_start_matches(limits::NVML_REGION),
                        human_bytes(m)
                    ));
                }
                continue;
            }
            if r.max.is_some() && !mapped {
                kernel_said = true;
                parts.push(format!(
                    "cgroup dmem.max region {} matches no device of this process (not applied)",
                    r.region
                ));
            }
            if let Some(m) = r.min {
                kernel_said = true;
                parts.push(format!(
                    "cgroup dmem.min {} {} (protected, not a bound)",
                    r.region,
                    human_bytes(m)
                ));
            }
        }
        if !s.replaced.is_empty() {
            parts.push(format!("VRAMSHIM_CAP replaces {}", s.replaced.join(", ")));
        }
        if parts.is_empty() {
            return;
        }
        let line = format!(
            "vramshim: cap from {}; the smallest bound applies",
            parts.join("; ")
        );
        let loud = kernel_said
            || !s.replaced.is_empty()
            || s.origin
                .iter()
                .flatten()
                .any(|o| !o.starts_with("VRAMSHIM_CAP="));
        if loud {
            (self.log)(&line);
        } else {
            crate::info!("{}", line.strip_prefix("vramshim: ").unwrap_or(&line));
        }
    }

    /// The shared region cannot be used (squatted by another user, foreign, corrupt, of
    /// another version, or `VRAMSHIM_SHARED` names none): the cap fails closed. The process keeps its own cap (the one
    /// `VRAMSHIM_CAP` gave it, not shared with the group), or with `VRAMSHIM_CAP_STRICT=1`
    /// every device allocation is refused. One line says which. Returns whether the cap is
    /// active.
    #[cold]
    fn region_unusable(&self, name: &str, why: &str) -> bool {
        let head = format!(
            "vramshim: VRAMSHIM_SHARED=\"{}\": {why}",
            name.escape_debug()
        );
        if self.settings.fault == Fault::SquatPassThrough {
            (self.log)(&format!("{head}; running without a cap (pass-through)"));
            return false;
        }
        if self.settings.strict {
            (self.log)(&format!(
                "{head}; VRAMSHIM_CAP_STRICT=1: every device allocation of this process is refused"
            ));
            self.refuse_all.store(true, Relaxed);
            // Every device counts as capped, also without a cap of its own (a member that
            // joins the group's cap), so memory queries report nothing free; a device without
            // a bound of its own keeps reporting its whole memory as its total.
            let mut spec = self.settings.spec.clone();
            for d in spec.devices.iter_mut().filter(|d| d.is_none()) {
                *d = Some(vramshim_region::CapValue::Fraction(1.0));
            }
            let _ = self.spec.set(spec);
            return true;
        }
        // Its VRAMSHIM_CAP, or another tool's variables that gave it a cap of its own.
        match self.own_cap_source() {
            Some(t) => {
                (self.log)(&format!(
                    "{head}; this process keeps its own cap {t} (not shared with the group; VRAMSHIM_CAP_STRICT=1 refuses allocations instead)"
                ));
                let _ = self
                    .spec
                    .set(self.with_kernel_limits(self.settings.spec.clone()));
                true
            }
            None => {
                (self.log)(&format!(
                    "{head}; no VRAMSHIM_CAP of its own to keep: running without a cap (set VRAMSHIM_CAP and VRAMSHIM_CAP_STRICT=1 to refuse allocations instead)"
                ));
                false
            }
        }
    }

    fn cap_source_text(&self, spec: &CapSpec) -> String {
        self.settings
            .cap_text
            .clone()
            .unwrap_or_else(|| spec.to_text())
    }

    fn effective_spec(&self) -> &CapSpec {
        static NONE: CapSpec = CapSpec {
            devices: [None; MAX_DEVICES],
            all: false,
        };
        self.spec.get().unwrap_or(&NONE)
    }

    /// Whether `device` has a cap: the process's (or its group's), or a group member's own
    /// where the group's leaves the device uncapped.
    pub(crate) fn is_capped(&self, device: i32) -> bool {
        self.ready()
            && (self.effective_spec().get(device).is_some()
                || device_index(device).is_some_and(|d| self.member_cap(d) < MAX_BYTES))
    }

    /// The cap that binds the process on `device` in bytes: its own, or in a group the
    /// smaller of the group's and the member's own (None: uncapped, or a share of a total not
    /// known yet).
    pub(crate) fn binding_limit(&self, device: i32) -> Option<u64> {
        let d = device_index(device)?;
        self.is_capped(device)
            .then(|| self.cap_bytes(d).min(self.member_cap(d)))
            .filter(|&b| b < MAX_BYTES)
    }

    /// The cap of the process's `VRAMSHIM_SHARED` group on `device` in bytes (None: not in a
    /// group, the group's cap leaves the device uncapped, or a share of a total not known yet).
    pub(crate) fn group_limit(&self, device: i32) -> Option<u64> {
        let d = device_index(device)?;
        (self.ready() && self.region.get().is_some() && self.effective_spec().devices[d].is_some())
            .then(|| self.cap_bytes(d))
            .filter(|&b| b < MAX_BYTES)
    }

    /// The cap of device `d` in bytes (`MAX_BYTES` when uncapped or not known yet).
    #[inline]
    fn cap_bytes(&self, d: usize) -> u64 {
        let r = self.resolved[d].load(Relaxed);
        if r != UNRESOLVED {
            return r;
        }
        self.resolve(d, None)
    }

    #[cold]
    fn resolve(&self, d: usize, real_total: Option<u64>) -> u64 {
        use vramshim_region::CapValue;
        let v = match self.effective_spec().devices[d] {
            None => MAX_BYTES,
            Some(CapValue::Bytes(b)) => {
                let v = self.bounded_by_kernel(d, b.min(MAX_BYTES));
                self.note_device_bound(d, v, real_total);
                v
            }
            Some(c @ CapValue::Fraction(_)) => {
                match real_total
                    .filter(|&t| t > 0)
                    .or_else(|| (self.queries().total)(d as i32))
                {
                    Some(t) => {
                        let v = self.bounded_by_kernel(d, c.resolve(t).min(MAX_BYTES));
                        if v == 0 && !self.unresolved_said[d].swap(true, Relaxed) {
                            // A share so small it rounds to nothing: enforced (every
                            // allocation refused), but never silently.
                            let spec = self.effective_spec();
                            (self.log)(&format!(
                                "vramshim: VRAMSHIM_CAP=\"{}\" is 0 bytes of device {d}'s {t} bytes: every allocation on device {d} is refused; {}",
                                self.cap_source_text(spec).escape_debug(),
                                vramshim_region::spec::CAP_FORMS
                            ));
                        }
                        v
                    }
                    None => {
                        // A share of an unknown total cannot be enforced: say so once rather
                        // than letting the user believe the device is capped. Requests keep
                        // asking (a driver initialised later, or the first memory-information
                        // call, resolves it).
                        if !self.unresolved_said[d].swap(true, Relaxed) {
                            let spec = self.effective_spec();
                            (self.log)(&format!(
                                "vramshim: VRAMSHIM_CAP=\"{}\" caps device {d} at a share of its memory, but its total memory is not known yet (the driver did not report it); device {d} runs uncapped until it is",
                                self.cap_source_text(spec).escape_debug()
                            ));
                        }
                        return self.kernel_limit(d).map_or(MAX_BYTES, |k| k.bytes);
                    }
                }
            }
        };
        self.resolved[d].store(v, Relaxed);
        v
    }

    /// Tells the cap the real total memory of `device` (resolves a fraction cap).
    pub(crate) fn note_device_total(&self, device: i32, real_total: u64) {
        if let Some(d) = device_index(device)
            && real_total > 0
            && self.ready()
            && self.resolved[d].load(Relaxed) == UNRESOLVED
        {
            self.resolve(d, Some(real_total));
        }
    }

    /// Bytes charged on `device`: this process's (private cap) or the whole group's (shared).
    pub(crate) fn in_use(&self, device: i32) -> u64 {
        let Some(d) = device_index(device) else {
            return 0;
        };
        match self.region.get() {
            Some(r) => self.line(r, d).map_or(0, |l| r.in_use(l)),
            None => vramshim_region::total_bytes(&self.private_used[d]),
        }
    }

    /// What memory-information queries count as taken: [`Cap::in_use`] plus a context
    /// footprint still waiting for room (everything when allocations are refused outright).
    fn held(&self, device: i32) -> u64 {
        let Some(d) = device_index(device) else {
            return 0;
        };
        if self.refuse_all.load(Relaxed) {
            return MAX_BYTES;
        }
        self.in_use(device)
            .saturating_add(self.ctx_pending[d].load(Relaxed))
    }

    /// The region's line counting ordinal `d` of this process: the line of the device's UUID
    /// (looked up once). None: no line could be had; the device then runs uncapped (warned).
    #[inline]
    fn line(&self, r: &Region, d: usize) -> Option<usize> {
        match self.lines[d].load(Relaxed) {
            LINE_UNKNOWN => self.look_up_line(r, d),
            LINE_NONE => None,
            l => Some(l as usize - 1),
        }
    }

    #[cold]
    fn look_up_line(&self, r: &Region, d: usize) -> Option<usize> {
        let line = if self.settings.fault == Fault::OrdinalLines {
            Some(d)
        } else {
            let id = (self.queries().uuid)(d as i32).map_or_else(|| DeviceId::ordinal(d), DeviceId);
            r.line_for_with(
                id,
                vramshim_region::LineFaults {
                    die_after_claim: self.settings.fault == Fault::DieClaimingLine,
                    no_recovery: self.settings.fault == Fault::NoClaimRecovery,
                },
            )
        };
        match line {
            Some(l) => self.lines[d].store(l as u8 + 1, Relaxed),
            None => {
                self.lines[d].store(LINE_NONE, Relaxed);
                (self.log)(&format!(
                    "vramshim: the shared cap region {} counts {} other devices already (or a stopped member holds a line mid-claim); capped allocations on device {d} of this process are refused (the group's cap could not be kept otherwise)",
                    r.path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    MAX_DEVICES
                ));
            }
        }
        line
    }

    fn check(&self) -> Check {
        if self.settings.fault == Fault::RacyCharge {
            Check::Racy
        } else {
            Check::Atomic
        }
    }

    fn my_slot(&self, r: &Region) -> Option<SlotIndex> {
        let s = self.slot.load(Acquire);
        if s != NO_SLOT {
            return Some(SlotIndex(s));
        }
        if self.slots_full_once.load(Relaxed) {
            // No slot could be had: its capped allocations are refused (said once). Try again
            // now and then (members that exit free theirs), not on every allocation.
            let now = crate::sys::clock::now_ns();
            let last = self.last_slot_try_ns.load(Relaxed);
            if now.saturating_sub(last) < RECLAIM_EVERY_NS {
                return None;
            }
            self.last_slot_try_ns.store(now.max(1), Relaxed);
        }
        self.claim_slot(r)
    }

    #[cold]
    fn claim_slot(&self, r: &Region) -> Option<SlotIndex> {
        let Some(me) = ProcessKey::current() else {
            self.slots_full_once.store(true, Relaxed);
            return None;
        };
        let start = vramshim_region::proc::stat(me.pid()).map_or(0, |(s, _)| s);
        // Slots this process held before an exec replaced its image are garbage now.
        if self.settings.fault != Fault::NoReclaim {
            r.reclaim_replaced_images(me, self.image);
        }
        let mut got = r.claim_slot(me, start);
        if got.is_none() {
            self.reclaim(r, me);
            got = r.claim_slot(me, start);
        }
        let Some(i) = got else {
            if !self.slots_full_once.swap(true, Relaxed) {
                self.last_slot_try_ns
                    .store(crate::sys::clock::now_ns().max(1), Relaxed);
                let what = if self.settings.fault == Fault::SlotsUncapped {
                    "this process runs without a cap"
                } else {
                    "this process's capped device allocations are refused until a slot frees (the group's cap could not be kept otherwise)"
                };
                (self.log)(&format!(
                    "vramshim: the shared cap region {} has no free process slot ({} processes share it); {what}",
                    r.path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    vramshim_region::MAX_SLOTS
                ));
            }
            return None;
        };
        r.set_image(i, self.image);
        match self.slot.compare_exchange(NO_SLOT, i.0, AcqRel, Acquire) {
            Ok(_) => Some(i),
            Err(other) => {
                r.release_slot(i);
                Some(SlotIndex(other))
            }
        }
    }

    fn reclaim(&self, r: &Region, me: ProcessKey) -> vramshim_region::Reclaimed {
        match self.settings.fault {
            Fault::NoReclaim => vramshim_region::Reclaimed::default(),
            Fault::PidOnly => r.reclaim_with(me, &|k| k.alive(false)),
            _ => r.reclaim(me),
        }
    }

    /// Reserve `bytes` on `device` for a request coming through `api` (bytes as given: see
    /// [`Cap::charge_alloc`] for an allocation's footprint).
    #[inline]
    pub(crate) fn try_charge(&self, device: i32, bytes: u64, api: Api) -> Result<(), Refusal> {
        self.try_charge_on(device, bytes, api, 0)
    }

    /// [`Cap::try_charge`] for a request on `stream` (0: the legacy stream): before a
    /// refusal, the driver's pools give back what they cache of freed stream-ordered blocks
    /// (never while `stream` captures).
    #[inline]
    pub(crate) fn try_charge_on(
        &self,
        device: i32,
        bytes: u64,
        api: Api,
        stream: u64,
    ) -> Result<(), Refusal> {
        self.charge_on(device, bytes, api, stream, false, false)
    }

    /// [`Cap::try_charge_on`]; `wait`: a refusal may wait for room (`VRAMSHIM_ON_CAP`);
    /// `hold`: the caller makes its real allocation next (see [`Cap::settle_pool_cache`]).
    #[inline]
    fn charge_on(
        &self,
        device: i32,
        bytes: u64,
        api: Api,
        stream: u64,
        wait: bool,
        hold: bool,
    ) -> Result<(), Refusal> {
        if !self.ready() {
            return Ok(());
        }
        let Some(d) = device_index(device) else {
            return Ok(());
        };
        match self.reserve_checked(d, bytes, stream, hold) {
            Ok(()) => Ok(()),
            Err(r) => self.after_refusal(d, bytes, api, stream, r, wait, hold),
        }
    }

    /// A charge of [`Cap::charge_on`] did not fit: wait for room if asked (`wait`), else (or
    /// when the wait ends in vain) say so. Out of line: the charge's path stays as it was.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn after_refusal(
        &self,
        d: usize,
        bytes: u64,
        api: Api,
        stream: u64,
        r: Refusal,
        wait: bool,
        hold: bool,
    ) -> Result<(), Refusal> {
        let r = if wait {
            self.wait_for_room(d, bytes, stream, r, hold)
        } else {
            Err(r)
        };
        r.map_err(|r| self.refused(d, bytes, r.in_use, r.cap, api))
    }

    /// The charge of [`Cap::try_charge_on`] on device `d`, saying nothing when it is refused
    /// (what was in use, the context footprint still waiting included, and the cap). `hold`:
    /// the caller makes its real allocation next, and a settle made for this charge keeps its
    /// section open over it when the charge then fits ([`Cap::settle_pool_cache`]).
    #[inline]
    pub(super) fn reserve_checked(
        &self,
        d: usize,
        bytes: u64,
        stream: u64,
        hold: bool,
    ) -> Result<(), Refusal> {
        if self.refuse_all.load(Relaxed) {
            return Err(Refusal { in_use: 0, cap: 0 });
        }
        if self.ctx_state[d].load(Relaxed) < CTX_TRIES {
            self.measure_context(d);
        }
        // A context footprint that did not fit when measured is charged with this request.
        let ctx = if self.ctx_pending[d].load(Relaxed) != 0 {
            self.ctx_pending[d].swap(0, AcqRel)
        } else {
            0
        };
        let want = bytes.saturating_add(ctx);
        let cap = self.cap_bytes(d);
        let mut r = self.reserve(d, want, cap);
        if r.is_err()
            && self.pool_cached[d].load(Relaxed) != 0
            && self.settle_pool_cache(d, stream, hold)
        {
            r = self.reserve(d, want, cap);
            if r.is_err() && hold {
                // no real call follows: the begins on other threads wait no longer
                captures::release_held();
            }
        }
        match r {
            Ok(_) => {
                if ctx > 0 {
                    self.ctx_charged[d].fetch_add(ctx, Relaxed);
                }
                Ok(())
            }
            Err(r) => {
                if ctx > 0 {
                    self.ctx_pending[d].fetch_add(ctx, AcqRel);
                }
                Err(Refusal {
                    in_use: r.in_use.saturating_add(ctx),
                    cap: r.cap,
                })
            }
        }
    }

    /// Reserves `want` bytes on device `d` under `cap` (the process's counter or its slot in
    /// the shared region, a member's own cap first): the new total, or what was in use when
    /// it did not fit and the cap that refused. Inlined: out of line, its three-word result
    /// went back through memory, 15 instructions on every capped request.
    #[inline(always)]
    fn reserve(&self, d: usize, want: u64, cap: u64) -> Result<u64, Refusal> {
        let refused = |in_use| Refusal { in_use, cap };
        match self.region.get() {
            None => match self.check() {
                Check::Atomic => vramshim_region::reserve(&self.private_used[d], want, cap),
                Check::Racy => vramshim_region::reserve_racy(&self.private_used[d], want, cap),
            }
            .map_err(refused),
            Some(region) => {
                self.member_reserve(d, want)?;
                let r = self.reserve_shared(region, d, want, cap);
                if r.is_err() {
                    self.member_release(d, want);
                }
                r.map_err(refused)
            }
        }
    }

    /// [`Cap::reserve`] on the group's total.
    #[inline]
    fn reserve_shared(&self, region: &Region, d: usize, want: u64, cap: u64) -> Result<u64, u64> {
        match (self.my_slot(region), self.line(region, d)) {
            (Some(slot), Some(line)) => match region.charge(slot, line, want, cap, self.check()) {
                Ok(t) => Ok(t),
                Err(in_use) => self
                    .retry_after_reclaim(region, slot, line, want, cap)
                    .ok_or(in_use),
            },
            // No slot or no line: the group's total cannot hold this process's bytes,
            // so a capped device refuses (fail closed).
            _ if self.effective_spec().devices[d].is_none()
                || self.settings.fault == Fault::SlotsUncapped =>
            {
                Ok(0)
            }
            _ => Err(0),
        }
    }

    /// The cap would refuse a request on device `d`: empty the driver's pools of the blocks
    /// they cache (`DeviceQueries::settle_pools`) and, when nothing stays cached, give back
    /// the charges of the stream-ordered frees made before. Returns whether anything was
    /// given back. Frees recorded meanwhile keep their charge (their blocks may be cached
    /// after the pools were emptied); when something stays cached the charges stay too.
    ///
    /// `hold`: the request makes its real allocation once charged (a potentially unsafe call:
    /// `cudaMalloc`, a stream-ordered allocation on a stream that does not capture). The
    /// settle's decision that no capture is under way is made for that call too, and the
    /// request began before any begin-capture call that finds the settle in flight: when the
    /// pools were emptied the settle's section (`captures::gated_held`) stays open until the
    /// real call returned ([`real_call_returned`]), or until the charge is refused after all
    /// ([`Cap::reserve_checked`]), so that such a begin's real call comes after it. Without
    /// `hold` (the pool's pages, charged under its lock, which a begin waits for; a charge
    /// that is not followed by a real allocation) the section ends with the settle.
    #[cold]
    #[inline(never)]
    fn settle_pool_cache(&self, d: usize, stream: u64, hold: bool) -> bool {
        let before = self.pool_cached[d].load(Acquire);
        if before == 0 {
            return false;
        }
        let settle = || (self.queries().settle_pools)(d as i32, stream) == Some(0);
        let settled = if hold {
            captures::gated_held(settle)
        } else {
            settle()
        };
        // testing only: a begin on another thread may come now (`pause-settled`)
        crate::sys::pause::at(crate::sys::pause::Point::Settled, || settled);
        if !settled {
            return false;
        }
        let _ = self.pool_cached[d].fetch_sub(before, AcqRel);
        self.uncharge(d as i32, before);
        true
    }

    #[cfg(test)]
    /// Charges of freed stream-ordered allocations still held on `device` (see
    /// [`Cap::uncharge_freed`]).
    pub(crate) fn pool_cached(&self, device: i32) -> u64 {
        device_index(device).map_or(0, |d| self.pool_cached[d].load(Relaxed))
    }

    #[cfg(test)]
    /// Reserves what an allocation of `size` bytes through `api` will cost the device (its
    /// footprint; a packed one may need a page of its own). Returns the charge to hand to
    /// [`Cap::settle_alloc`] once the allocation is made (or to [`Cap::uncharge`] if it fails).
    /// No real call follows here: a settle of the driver's pools ends with the charge.
    #[inline]
    pub(crate) fn charge_alloc(&self, device: i32, size: u64, api: Api) -> Result<u64, Refusal> {
        let bytes = self.charge_of(size, api).worst_case();
        self.charge_on(device, bytes, api, 0, true, false)
            .map(|()| bytes)
    }

    /// [`Cap::charge_alloc`] for a request on `stream` (see [`Cap::try_charge_on`]).
    #[inline]
    pub(crate) fn charge_alloc_on(
        &self,
        device: i32,
        size: u64,
        api: Api,
        stream: u64,
    ) -> Result<u64, Refusal> {
        let bytes = self.charge_of(size, api).worst_case();
        self.charge_on(device, bytes, api, stream, true, true)
            .map(|()| bytes)
    }

    /// [`Cap::charge_alloc_on`], where a refusal first asks `release_cached` to give back
    /// memory charged but not in use (true: some was) and tries once more; only the final
    /// refusal is reported.
    pub(crate) fn charge_alloc_or(
        &self,
        device: i32,
        size: u64,
        api: Api,
        stream: u64,
        release_cached: impl FnOnce() -> bool,
    ) -> Result<u64, Refusal> {
        let bytes = self.charge_of(size, api).worst_case();
        if !self.ready() {
            return Ok(bytes);
        }
        let Some(d) = device_index(device) else {
            return Ok(bytes);
        };
        let r = match self.reserve_checked(d, bytes, stream, true) {
            Err(_) if !self.refuse_all.load(Relaxed) && release_cached() => {
                self.reserve_checked(d, bytes, stream, true)
            }
            r => r,
        };
        r.or_else(|r| self.wait_for_room(d, bytes, stream, r, true))
            .map(|()| bytes)
            .map_err(|r| self.refused(d, bytes, r.in_use, r.cap, api))
    }

    fn charge_of(&self, size: u64, api: Api) -> Footprint {
        if self.settings.fault == Fault::RequestedBytes {
            return Footprint::Own(size);
        }
        footprint(size, api == Api::CuMemCreate)
    }

    /// The allocation made with `charged` (from [`Cap::charge_alloc`]) is at `addr` and has
    /// `size` bytes (more than asked for a pitched one): settles the charge to its footprint
    /// and returns what the live table records (to give back with [`Cap::uncharge_entry`]).
    /// A packed allocation in a page this process already pays for gives its page back.
    pub(crate) fn settle_alloc(
        &self,
        device: i32,
        addr: u64,
        size: u64,
        charged: u64,
        api: Api,
    ) -> u64 {
        if charged == 0 {
            return 0;
        }
        match self.charge_of(size, api) {
            Footprint::Own(b) => {
                // Pitched allocations: the padding is known only now.
                if b > charged && self.try_charge(device, b - charged, api).is_ok() {
                    return b;
                }
                charged
            }
            Footprint::Packed if charged != DEVICE_PAGE => charged,
            Footprint::Packed => match self.packed_add(device, addr) {
                Some(true) => PACKED_CHARGE,
                Some(false) => {
                    self.uncharge(device, DEVICE_PAGE);
                    PACKED_CHARGE
                }
                // The table was busy: the allocation keeps a page of its own (over-counts).
                None => charged,
            },
        }
    }

    /// Counts a live packed allocation in its page: `Some(true)` when the page is new (its
    /// charge stays), `Some(false)` when already paid for, `None` when the table is busy.
    fn packed_add(&self, device: i32, addr: u64) -> Option<bool> {
        let d = device_index(device)?;
        let mut g = self.packed_lock(PACKED_LOCK_TRIES)?;
        let n = g.entry((d, page_of(addr))).or_insert(0);
        *n += 1;
        Some(*n == 1)
    }

    fn packed_lock(&self, tries: u32) -> Option<PackedGuard<'_>> {
        self.packed.lock(tries)
    }

    /// Gives back what a live-table entry recorded ([`Cap::settle_alloc`]) for the allocation
    /// at `addr`: a packed one frees its page's charge when it was the page's last.
    pub(crate) fn uncharge_entry(&self, device: i32, addr: u64, charged: u64) {
        self.uncharge_freed(device, addr, charged, false);
    }

    /// [`Cap::uncharge_entry`] for a freed allocation; `stream_ordered`: it came from a
    /// driver memory pool (`cudaMallocAsync` & co.), which may keep the block cached after
    /// the free: its charge moves to the device's pool-cached charge instead of going back
    /// (given back when the cap would refuse and the pools are emptied).
    pub(crate) fn uncharge_freed(
        &self,
        device: i32,
        addr: u64,
        charged: u64,
        stream_ordered: bool,
    ) {
        let give_back = |bytes: u64| match device_index(device) {
            Some(d)
                if stream_ordered
                    && self.settings.fault != Fault::AsyncUncharge
                    && self.active() =>
            {
                self.pool_cached[d].fetch_add(bytes, AcqRel);
            }
            _ => self.uncharge(device, bytes),
        };
        if charged != PACKED_CHARGE {
            if charged > 0 {
                give_back(charged);
            }
            return;
        }
        let Some(d) = device_index(device) else {
            return;
        };
        // The lock is only ever held for a map update (and a fork child resets it): wait for
        // it long enough that it cannot stay busy short of a bug (then the page stays
        // charged: over-counting, never under).
        let Some(mut g) = self.packed_lock(PACKED_LOCK_TRIES * 1000) else {
            return;
        };
        let key = (d, page_of(addr));
        let last = match g.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                g.remove(&key);
                true
            }
            None => false,
        };
        drop(g);
        if last {
            give_back(DEVICE_PAGE);
        }
    }

    #[cold]
    fn retry_after_reclaim(
        &self,
        region: &Region,
        slot: SlotIndex,
        line: usize,
        bytes: u64,
        cap: u64,
    ) -> Option<u64> {
        let now = crate::sys::clock::now_ns();
        let last = self.last_reclaim_ns.load(Relaxed);
        if last != 0 && now.saturating_sub(last) < RECLAIM_EVERY_NS {
            return None;
        }
        self.last_reclaim_ns.store(now.max(1), Relaxed);
        let me = ProcessKey::current()?;
        let got = self.reclaim(region, me);
        if got.slots == 0 {
            return None;
        }
        region.charge(slot, line, bytes, cap, self.check()).ok()
    }

    #[cold]
    fn refused(&self, d: usize, bytes: u64, in_use: u64, cap: u64, api: Api) -> Refusal {
        let slot = self.slot.load(Relaxed);
        if let Some(region) = self.region.get()
            && slot != NO_SLOT
            && let Some(line) = self.line(region, d)
        {
            region.note_refusal(SlotIndex(slot), line);
        }
        let capped = self.effective_spec().devices[d].is_some();
        // Refused outright (strict mode, or no slot in the region): its line is out already.
        let said =
            self.refuse_all.load(Relaxed) || (self.region.get().is_some() && slot == NO_SLOT);
        let first = capped && !said && !self.refused_once.load(Relaxed);
        // Why a wait (VRAMSHIM_ON_CAP=wait) ended in this refusal, said once per reason.
        let waited = self.wait_note(first).map(|n| format!("; {n}"));
        if !first && let Some(n) = &waited {
            (self.log)(&format!(
                "vramshim: {} of {} on device {d} refused{n}",
                api.name(),
                human_bytes(bytes)
            ));
        }
        if capped && !said && !self.refused_once.swap(true, Relaxed) {
            let who = match self
                .settings
                .shared
                .as_ref()
                .filter(|_| self.region.get().is_some())
            {
                None => self.bound_by(d),
                Some((name, _)) if self.member_binds(d, cap) => format!(
                    "{}, this process's own cap inside the budget shared by VRAMSHIM_SHARED=\"{}\" (VRAMSHIM_CAP=\"{}\" for the group)",
                    self.own_cap_source().unwrap_or_default(),
                    name.escape_debug(),
                    self.region.get().map(|r| r.cap_text()).unwrap_or_default(),
                ),
                Some(_) if self.kernel_binds[d].load(Relaxed) => self.bound_by(d),
                // The group's cap came from this process's own limits of another tool.
                Some((name, _))
                    if self.settings.cap_text.is_none()
                        && self.settings.origin[d].is_some()
                        && self
                            .region
                            .get()
                            .is_some_and(|r| r.caps() == self.settings.spec) =>
                {
                    format!(
                        "{} of the budget shared by VRAMSHIM_SHARED=\"{}\"",
                        self.bound_by(d),
                        name.escape_debug()
                    )
                }
                Some((name, _)) => format!(
                    "VRAMSHIM_CAP=\"{}\" of the budget shared by VRAMSHIM_SHARED=\"{}\"",
                    self.region.get().map(|r| r.cap_text()).unwrap_or_default(),
                    name.escape_debug()
                ),
            };
            (self.log)(&format!(
                "vramshim: {} of {} ({bytes} bytes) on device {d} refused: {} in use + {} > cap {} (set by {who}){}; further refusals are not printed",
                api.name(),
                human_bytes(bytes),
                human_bytes(in_use),
                human_bytes(bytes),
                human_bytes(cap),
                waited.as_deref().unwrap_or(""),
            ));
        }
        Refusal { in_use, cap }
    }

    /// Give back a reservation made by `try_charge`.
    #[inline]
    pub(crate) fn uncharge(&self, device: i32, bytes: u64) {
        if bytes == 0 || !self.active() {
            return;
        }
        let Some(d) = device_index(device) else {
            return;
        };
        match self.region.get() {
            None => vramshim_region::release(&self.private_used[d], bytes),
            Some(region) => {
                self.member_release(d, bytes);
                let s = self.slot.load(Acquire);
                if s != NO_SLOT
                    && let Some(line) = self.line(region, d)
                {
                    region.uncharge(SlotIndex(s), line, bytes);
                }
            }
        }
    }

    /// `(free, total)` for a memory-information query: total = cap (at most the real
    /// total), free = cap - in use, clamped to [0, real free].
    #[inline]
    pub(crate) fn adjust_meminfo(
        &self,
        device: i32,
        real_free: u64,
        real_total: u64,
    ) -> (u64, u64) {
        let Some(total) = self.capped_total(device, real_total) else {
            return (real_free, real_total);
        };
        if let Some(d) = device_index(device)
            && self.ctx_state[d].load(Relaxed) < CTX_TRIES
        {
            self.measure_context(d);
        }
        let (total, free) = self.cap_view(device, total);
        (free.min(real_free), total)
    }

    /// `(total, free)` under the cap whose total is `total` ([`Cap::capped_total`]): free is
    /// the total less what is held; a group member's own cap bounds both (alone where the
    /// group's cap leaves the device uncapped: what the group holds there bounds nothing).
    fn cap_view(&self, device: i32, total: u64) -> (u64, u64) {
        match device_index(device) {
            Some(d) if self.effective_spec().devices[d].is_none() => {
                self.member_view(d, total, total)
            }
            Some(d) => self.member_view(d, total, total.saturating_sub(self.held(device))),
            None => (total, total.saturating_sub(self.held(device))),
        }
    }

    /// The capped total (None when the device has no cap): the cap's, or on a device the
    /// group's cap leaves uncapped a group member's own, at most the real total.
    fn capped_total(&self, device: i32, real_total: u64) -> Option<u64> {
        let d = device_index(device)?;
        if !self.ready() {
            return None;
        }
        if self.effective_spec().devices[d].is_none() {
            let own = self.member_cap(d);
            return (own < MAX_BYTES).then(|| {
                if real_total > 0 {
                    own.min(real_total)
                } else {
                    own
                }
            });
        }
        let cap = match self.resolved[d].load(Relaxed) {
            UNRESOLVED => self.resolve(d, Some(real_total)),
            c => c,
        };
        Some(if real_total > 0 {
            cap.min(real_total)
        } else {
            cap
        })
    }

    /// Total memory to report for `device` (`cuDeviceTotalMem_v2`, `totalGlobalMem`).
    #[inline]
    pub(crate) fn total_for(&self, device: i32, real_total: u64) -> u64 {
        match (self.capped_total(device, real_total), device_index(device)) {
            (Some(t), Some(d)) => t.min(self.member_cap(d)),
            (t, _) => t.unwrap_or(real_total),
        }
    }

    /// NVML `nvmlMemory_t` (total, free, used): total = cap, free as in
    /// [`Cap::adjust_meminfo`], used = total - free (so free + used = total, as NVML has it).
    pub(crate) fn nvml_adjust(
        &self,
        device: i32,
        total: u64,
        free: u64,
        used: u64,
    ) -> (u64, u64, u64) {
        let Some(t) = self.capped_total(device, total) else {
            return (total, free, used);
        };
        let (t, f) = self.cap_view(device, t);
        let f = f.min(free);
        (t, f, t - f)
    }

    /// NVML `nvmlMemory_v2_t` (total, reserved, free, used): as [`Cap::nvml_adjust`], with the
    /// reserved part kept (at most what is not free) and used = total - reserved - free.
    pub(crate) fn nvml_adjust_v2(
        &self,
        device: i32,
        total: u64,
        reserved: u64,
        free: u64,
        used: u64,
    ) -> (u64, u64, u64, u64) {
        let Some(t) = self.capped_total(device, total) else {
            return (total, reserved, free, used);
        };
        let (t, f) = self.cap_view(device, t);
        let f = f.min(free);
        let r = reserved.min(t - f);
        (t, r, f, t - f - r)
    }

    /// The process's first context on `device` appeared: charge its footprint (driver free
    /// memory before and after its creation) unless `VRAMSHIM_CAP_CONTEXT=exclude`. Never
    /// refused (the context exists already); it only lowers what allocations may take.
    /// Charged once per context lifetime: a first-touch measurement that got there first
    /// wins, and [`Cap::on_context_destroyed`] starts a new lifetime.
    pub(crate) fn on_context_created(&self, device: i32, free_before: u64, free_after: u64) {
        let Some(d) = device_index(device) else {
            return;
        };
        // Once per context: if the first-touch measurement already charged it (another
        // thread got there first), do not charge it twice.
        loop {
            match self.ctx_state[d].load(Acquire) {
                CTX_DONE => return,
                CTX_BUSY => std::hint::spin_loop(),
                s => {
                    if self.ctx_state[d]
                        .compare_exchange(s, CTX_DONE, AcqRel, Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
            }
        }
        // The device's free memory moves with every other process's allocations too: where
        // the driver can say what this process holds, that measures the context exactly. The
        // context was only just created, so nothing the driver lists for this process on the
        // device is an allocation yet: the allocation whose call created the context is
        // charged already but not made, and subtracting its charge would hide the context.
        let fp = match (self.queries().process_used)(d as i32) {
            Some(used) if self.ready() => used,
            _ => free_before.saturating_sub(free_after),
        };
        self.charge_context(d, fp);
    }

    /// What the cap charged this process on device `d` so far (its own bytes, also in a
    /// shared region).
    fn charged_here(&self, d: usize) -> u64 {
        match self.region.get() {
            None => vramshim_region::total_bytes(&self.private_used[d]),
            Some(r) => match (self.slot.load(Acquire), self.line(r, d)) {
                (NO_SLOT, _) | (_, None) => 0,
                (slot, Some(line)) => r.slot_used(SlotIndex(slot), line),
            },
        }
    }

    /// Measures the context's footprint on the first touches of device `d` (a charge or a
    /// memory-information query): the device memory the driver says this process holds,
    /// minus what the cap charged it so far. Retried on the next touches while the driver
    /// does not list the process yet (no context yet), at most `CTX_TRIES` times.
    #[cold]
    fn measure_context(&self, d: usize) {
        let s = self.ctx_state[d].load(Relaxed);
        if s >= CTX_TRIES {
            return;
        }
        if self.settings.context == ContextMode::Exclude
            || self.effective_spec().devices[d].is_none()
        {
            self.ctx_state[d].store(CTX_DONE, Relaxed);
            return;
        }
        if self.ctx_state[d]
            .compare_exchange(s, CTX_BUSY, AcqRel, Relaxed)
            .is_err()
        {
            return;
        }
        match (self.queries().process_used)(d as i32) {
            Some(used) => {
                self.charge_context(d, used.saturating_sub(self.charged_here(d)));
                self.ctx_state[d].store(CTX_DONE, Relaxed);
            }
            None => self.ctx_state[d].store(s + 1, Relaxed),
        }
    }

    /// Charges a context footprint, checked against the cap like any allocation: the
    /// context exists already, so when the cap has no room for it now it stays pending and
    /// is charged together with the next allocation (refused until both fit). The group's
    /// total never passes the cap this way.
    fn charge_context(&self, d: usize, footprint: u64) {
        if footprint == 0 || self.settings.context == ContextMode::Exclude || !self.ready() {
            return;
        }
        let cap = if self.settings.fault == Fault::UncheckedContext {
            MAX_BYTES
        } else {
            self.cap_bytes(d)
        };
        let ok = match self.region.get() {
            None => vramshim_region::reserve(&self.private_used[d], footprint, cap).is_ok(),
            Some(region) => match (self.my_slot(region), self.line(region, d)) {
                (Some(slot), Some(line)) if self.member_reserve(d, footprint).is_ok() => {
                    let ok = region
                        .charge(slot, line, footprint, cap, Check::Atomic)
                        .is_ok();
                    if !ok {
                        self.member_release(d, footprint);
                    }
                    ok
                }
                _ => false,
            },
        };
        if ok {
            self.ctx_charged[d].fetch_add(footprint, Relaxed);
        } else {
            self.ctx_pending[d].fetch_add(footprint, AcqRel);
        }
    }

    /// The context of `device` is gone: give its footprint back.
    pub(crate) fn on_context_destroyed(&self, device: i32) {
        if let Some(d) = device_index(device) {
            let fp = self.ctx_charged[d].swap(0, Relaxed);
            self.uncharge(device, fp);
            // The context's pools went with it.
            let cached = self.pool_cached[d].swap(0, AcqRel);
            self.uncharge(device, cached);
            self.ctx_pending[d].store(0, Relaxed);
            self.ctx_state[d].store(0, Relaxed);
        }
    }

    /// The context footprint charged on `device`.
    pub(crate) fn context_charged(&self, device: i32) -> u64 {
        device_index(device).map_or(0, |d| self.ctx_charged[d].load(Relaxed))
    }

    /// In a forked child: the child holds nothing yet and gets its own slot on first charge.
    /// A set-up another thread of the parent was running is taken back (what it made so far
    /// forgotten): the child's first capped call sets up again instead of waiting for a
    /// thread it does not have.
    pub(crate) fn on_fork_child(&self) {
        if self.setup.reset_in_child() {
            self.region.forget_in_child();
            self.spec.forget_in_child();
            self.kernel.forget_in_child();
            self.kernel_cgroup.forget_in_child();
            self.member.forget_in_child();
            for r in &self.member_resolved {
                r.store(UNRESOLVED, Relaxed);
            }
            self.refuse_all.store(false, Relaxed);
        }
        self.slot.store(NO_SLOT, Relaxed);
        for d in 0..MAX_DEVICES {
            self.private_used[d].store(0, Relaxed);
            self.ctx_charged[d].store(0, Relaxed);
            self.ctx_pending[d].store(0, Relaxed);
            self.ctx_state[d].store(0, Relaxed);
            self.pool_cached[d].store(0, Relaxed);
        }
        self.packed.reset_in_child();
        self.waits.reset_in_child();
        self.last_slot_try_ns.store(0, Relaxed);
        self.refused_once.store(false, Relaxed);
        self.slots_full_once.store(false, Relaxed);
        self.last_reclaim_ns.store(0, Relaxed);
    }
}

// ------------------------------------------------------------------------ the process's cap

static QUERIES: OnceLock<DeviceQueries> = OnceLock::new();
static GLOBAL: OnceLock<Option<Cap>> = OnceLock::new();

/// One stderr line through the interposer's logger (level `warn`; `VRAMSHIM_LOG=off`
/// silences it).
fn stderr_line(line: &str) {
    let line = line.strip_prefix("vramshim: ").unwrap_or(line);
    crate::warn!("{}", line.replace('\n', " "));
}

fn build_global() -> Option<Cap> {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0);
    // Lossy: a value that is not UTF-8 is then reported as not valid (with the accepted
    // forms) instead of reading as unset.
    let get = |k: &str| crate::config::raw(k).map(|v| String::from_utf8_lossy(v).into_owned());
    if get("VRAMSHIM_CAP_FAULT").is_some_and(|v| v.trim() == "panic-at-setup") {
        panic!("VRAMSHIM_CAP_FAULT=panic-at-setup");
    }
    // The kernel's limits: the dmem files of this process's cgroup (a few small reads).
    // VRAMSHIM_CGROUP_ROOT (tests) stands in for the cgroup v2 mount.
    let root = get("VRAMSHIM_CGROUP_ROOT")
        .filter(|v| !v.trim().is_empty())
        .map_or_else(
            || std::path::PathBuf::from("/sys/fs/cgroup"),
            |v| std::path::PathBuf::from(v.trim()),
        );
    let mut dmem = limits::own_cgroup()
        .map(|cg| limits::dmem(&root, &cg))
        .unwrap_or_default();
    // The driver's limits (NVML, r615+): nothing when NVML or the function is missing.
    dmem.extend(limits::nvml_regions(crate::cuda::nvml::memory_limits_all()));
    let (settings, lines) = config::parse_with(&get, uid, dmem);
    for l in &lines {
        stderr_line(l);
    }
    let _ = QUERIES.set(DeviceQueries {
        total: driver::total,
        count: driver::count,
        process_used: crate::cuda::nvml::process_used,
        uuid: driver::uuid,
        settle_pools: driver::settle_pools,
    });
    settings.map(|s| Cap::new(s, &QUERIES, stderr_line))
}

/// `VRAMSHIM_CAP_FAULT=setup-pause`: how long the set-up pauses.
const SETUP_PAUSE: std::time::Duration = std::time::Duration::from_secs(120);

/// `VRAMSHIM_CAP_FAULT=setup-pause`: one line, then the set-up stops for [`SETUP_PAUSE`],
/// so that a test can fork while a thread is inside it.
#[cold]
fn setup_pause() {
    crate::warn!(
        "VRAMSHIM_CAP_FAULT=setup-pause: the cap's set-up pauses for {} s",
        SETUP_PAUSE.as_secs()
    );
    std::thread::sleep(SETUP_PAUSE);
}

/// The process's cap (None = pass-through).
#[inline]
pub(crate) fn global() -> Option<&'static Cap> {
    GLOBAL.get_or_init(build_global_or_off).as_ref()
}

/// [`build_global`], where a panic (a bug, or a cgroup file read at load in every process)
/// leaves the process uncapped with one line: it runs at load, where an unwinding panic
/// would abort the user's job before it starts.
/// Rust's own report of the panic (several lines, a backtrace with `RUST_BACKTRACE`) is held
/// back for the while: the one line names the panic's message instead.
#[cold]
fn build_global_or_off() -> Option<Cap> {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(build_global);
    std::panic::set_hook(report);
    r.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| p.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("?");
        stderr_line(&format!(
            "internal error (panic: {msg}) while setting up the cap; running without a cap"
        ));
        None
    })
}

/// The cap that binds the process on `device` in bytes, for the node registry (see
/// [`Cap::binding_limit`]).
pub fn limit(device: i32) -> Option<u64> {
    global()?.binding_limit(device)
}

/// The cap of the process's `VRAMSHIM_SHARED` group on `device` in bytes, for the node
/// registry (see [`Cap::group_limit`]).
pub fn group_limit(device: i32) -> Option<u64> {
    global()?.group_limit(device)
}

/// The driver's UUID of `device`, for the node registry.
pub fn device_uuid(device: i32) -> Option<[u8; 16]> {
    driver::uuid(device)
}

/// Whether a request of the process waits for room on a shared cap now (the node
/// registry's `FLAG_WAITING`).
pub(crate) fn waiting_now() -> bool {
    GLOBAL
        .get()
        .and_then(Option::as_ref)
        .is_some_and(|c| c.waiting() > 0)
}

/// `flags::WAITED_ON_CAP` when the allocation this thread is making waited on the cap (read
/// once, for its trace event), else 0.
#[inline]
pub(crate) fn waited_flag() -> u8 {
    if wait::take_waited() {
        vramshim_trace::flags::WAITED_ON_CAP
    } else {
        0
    }
}

/// Called once at load: parses the variables and prints one line per bad value.
pub(crate) fn init() {
    let _ = global();
}

/// Called in a forked child before it does anything else.
pub(crate) fn on_fork_child() {
    if let Some(c) = GLOBAL.get().and_then(Option::as_ref) {
        c.on_fork_child();
    }
}

/// Reserve `bytes` on `device` for a request coming through `api`.
#[inline]
pub(crate) fn try_charge(device: i32, bytes: u64, api: Api) -> Result<(), Refusal> {
    match global() {
        Some(c) => c.try_charge(device, bytes, api),
        None => Ok(()),
    }
}

/// Reserve the footprint of an allocation of `size` bytes through `api` (see
/// [`Cap::charge_alloc`]); `Ok(0)` when there is no cap.
/// `stream`: the request's (0 for the legacy stream, and for requests with none).
#[inline]
pub(crate) fn charge_alloc(device: i32, size: u64, api: Api, stream: u64) -> Result<u64, Refusal> {
    match global() {
        Some(c) => c.charge_alloc_on(device, size, api, stream),
        None => Ok(0),
    }
}

/// [`charge_alloc`], where a refusal first asks `release_cached` to give back memory that is
/// charged but not in use (the pool's cached pages; true: some was) and tries once more.
#[inline]
pub(crate) fn charge_alloc_or(
    device: i32,
    size: u64,
    api: Api,
    stream: u64,
    release_cached: impl FnOnce() -> bool,
) -> Result<u64, Refusal> {
    match global() {
        Some(c) => c.charge_alloc_or(device, size, api, stream, release_cached),
        None => Ok(0),
    }
}

/// Whether `stream` (or the legacy stream) is capturing, or the driver cannot say: nothing
/// may synchronize the device then.
pub(crate) fn stream_capturing(stream: u64) -> bool {
    driver::capturing(stream)
}

/// The real allocation of a request charged by [`charge_alloc`] or [`charge_alloc_or`]
/// returned: a settle of the driver's pools made for the charge kept its section open over
/// that call (see [`Cap::settle_pool_cache`]), and it ends here. One load while no section
/// is open.
#[inline]
pub(crate) fn real_call_returned() {
    captures::release_held();
}

/// Settle a charge once the allocation is made (see [`Cap::settle_alloc`]).
#[inline]
pub(crate) fn settle_alloc(device: i32, addr: u64, size: u64, charged: u64, api: Api) -> u64 {
    match global() {
        Some(c) => c.settle_alloc(device, addr, size, charged, api),
        None => charged,
    }
}

/// Give back what a live-table entry recorded for the allocation at `addr`.
#[inline]
pub(crate) fn uncharge_entry(device: i32, addr: u64, charged: u64) {
    if let Some(c) = global() {
        c.uncharge_entry(device, addr, charged);
    }
}

/// Give back what a live-table entry recorded for the freed allocation at `addr`;
/// `stream_ordered`: it came from a driver memory pool (see [`Cap::uncharge_freed`]).
#[inline]
pub(crate) fn uncharge_freed(device: i32, addr: u64, charged: u64, stream_ordered: bool) {
    if let Some(c) = global() {
        c.uncharge_freed(device, addr, charged, stream_ordered);
    }
}

/// Give back a reservation made by `try_charge`.
#[inline]
pub(crate) fn uncharge(device: i32, bytes: u64) {
    if let Some(c) = global() {
        c.uncharge(device, bytes);
    }
}

/// What a memory-information query should answer given the real numbers: `(free, total)`.
#[inline]
pub(crate) fn adjust_meminfo(device: i32, real_free: u64, real_total: u64) -> (u64, u64) {
    match global() {
        Some(c) => c.adjust_meminfo(device, real_free, real_total),
        None => (real_free, real_total),
    }
}

/// Total memory to report for `device` (`cuDeviceTotalMem_v2`, `totalGlobalMem`).
#[inline]
pub(crate) fn total_for(device: i32, real_total: u64) -> u64 {
    match global() {
        Some(c) => c.total_for(device, real_total),
        None => real_total,
    }
}

/// `nvmlDeviceGetMemoryInfo`: `(total, free, used)` adjusted; `device` = CUDA ordinal.
pub(crate) fn nvml_adjust(device: i32, total: u64, free: u64, used: u64) -> (u64, u64, u64) {
    match global() {
        Some(c) => c.nvml_adjust(device, total, free, used),
        None => (total, free, used),
    }
}

/// `nvmlDeviceGetMemoryInfo_v2`: `(total, reserved, free, used)` adjusted.
pub(crate) fn nvml_adjust_v2(
    device: i32,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
) -> (u64, u64, u64, u64) {
    match global() {
        Some(c) => c.nvml_adjust_v2(device, total, reserved, free, used),
        None => (total, reserved, free, used),
    }
}

/// A context was created on `device` (driver free memory before and after).
pub(crate) fn on_context_created(device: i32, free_before: u64, free_after: u64) {
    if let Some(c) = global() {
        c.on_context_created(device, free_before, free_after);
    }
}

/// The context of `device` was destroyed.
pub(crate) fn on_context_destroyed(device: i32) {
    if let Some(c) = global() {
        c.on_context_destroyed(device);
    }
}

/// Tells the cap a device's real total (resolves fraction caps without a driver query).
pub(crate) fn note_device_total(device: i32, real_total: u64) {
    if let Some(c) = global() {
        c.note_device_total(device, real_total);
    }
}

#[cfg(test)]
mod tests;
