//! The shared-memory cap region behind `VRAMSHIM_SHARED=NAME`, used by `libvramshim.so` (to
//! charge allocations against one budget shared by every process with that name) and by
//! `vramshim top` (to show it). Also the `VRAMSHIM_CAP` parser ([`spec`]), shared with the CLI.
//!
//! # Layout (version 3)
//! One file, `/dev/shm/vramshim-<uid>-<name>` (mode 0600, owned by the user), mapped shared:
//! - a header: magic, version, layout size, number of devices and slots, creator uid, pid
//!   namespace, creation time, the cap of each device (none / bytes / fraction) and the text it
//!   came from, a "needs recount" bit per device;
//! - [`MAX_DEVICES`] device lines, one cache line each: which physical device the line counts
//!   (its 16-byte identity, the driver's UUID, claimed by the first process that charges it),
//!   the total charged (bytes in the low 44 bits, a modification counter in the high 20), the
//!   peak, the refusals, and for `VRAMSHIM_ON_CAP=wait` a wake-up generation (a futex word)
//!   and the number of members waiting on the line. Lines are keyed by identity, not by CUDA ordinal, because
//!   processes of one group may see the same device under different ordinals
//!   (`CUDA_VISIBLE_DEVICES=1` in one, `0,1` in another: both mean physical device 1);
//!   version 1 keyed them by ordinal and charged such processes against the wrong budget;
//!   version 2 had no waiting (its members would neither wake nor see waiters);
//! - [`MAX_SLOTS`] per-process slots, one cache-line group each: the owner's [`ProcessKey`]
//!   (pid + start time; bit 63 set while a dead owner's slot is being reclaimed), an in-flight
//!   counter, refusals, the full start time, the bytes it holds per device, and which lines
//!   it has a request waiting on (with when it began waiting).
//!
//! # Protocol (no lock anywhere)
//! - Create: a temporary file is created with `O_EXCL`, sized, initialised, its magic written
//!   last, and then published with `link()` under the final name (atomic: nobody ever sees a
//!   half-initialised region). Losing the race means attaching to the winner's region.
//! - Attach: the file must be a regular file owned by us, mode without group/other bits, of the
//!   exact layout size, with our magic, version, sizes, uid and pid namespace; anything else is
//!   refused with a [`RegionError`] whose text is the one line to print.
//! - Line of a device ([`Region::line_for`]): lines are scanned in order; a published line
//!   with the identity is the answer; a free line is claimed by CAS (free -> claimed by the
//!   claimer's [`ProcessKey`]), its identity written, then published by CAS (claimed by me ->
//!   published). Everyone scans in the same order and waits for a line being claimed to be
//!   published, so two processes never claim two lines for one device. A claim whose owner is
//!   surely dead (killed between the two steps: no such pid, a zombie, another start time) is
//!   taken over by CAS and finished by the taker; nothing is charged on a line before it is
//!   published, so there is nothing to repair.
//! - Charge: `inflight += 1`; CAS loop on the device total (refused if it would pass the cap);
//!   `slot.used[dev] += bytes`; `inflight -= 1`. Uncharge: the same bracket, slot first, then
//!   total (saturating: never below zero).
//! - Wait (`VRAMSHIM_ON_CAP=wait`, the [`wait`] module): a refused member marks its slot and
//!   the line's waiter count, reads the line's generation, retries, and sleeps on the
//!   generation (futex) with a bounded timeout; whoever gives bytes back on a line with
//!   waiters (uncharge, a clean exit, a reclaim, a recount) bumps the generation and wakes
//!   them. A dead waiter's marks go with its slot when it is reclaimed.
//! - Reclaim (at attach, after a refusal, by `vramshim top`): a slot whose owner is dead (no
//!   such pid, a zombie, or a different start time) is taken over by CAS of its key to
//!   `REAP | reclaimer`; if its in-flight counter is 0 its bytes are subtracted exactly,
//!   otherwise (killed in the middle of a charge) its bytes are dropped and the device is
//!   marked for a recount. A recount sets each total to the sum of the live slots, with a CAS
//!   against the total read before the scan and only when no slot is mid-operation or
//!   mid-reclaim, so it never loses a concurrent charge.
//!
//! All accounting is safe code over `AtomicU64` views; `mmap` lives in the private `sys` module.

pub mod proc;
pub mod registry;
pub mod spec;
mod sys;
pub mod wait;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

pub use proc::ProcessKey;
pub use spec::{CapSpec, CapValue, MAX_DEVICES};

/// "VRSHMCAP", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"VRSHMCAP");
/// Layout version; a region of another version is refused, never reinterpreted.
pub const VERSION: u64 = 3;
/// Processes that can share one region at a time.
pub const MAX_SLOTS: usize = 256;
/// Bits of a device total that hold bytes (the rest count modifications, against ABA).
pub const BYTES_BITS: u32 = 44;
/// The largest number of bytes a device total can hold (16 TiB - 1); larger caps are clamped.
pub const MAX_BYTES: u64 = (1 << BYTES_BITS) - 1;
pub(crate) const REAP_FLAG: u64 = 1 << 63;
const SPEC_WORDS: usize = 16;

const KIND_NONE: u64 = 0;
const KIND_BYTES: u64 = 1;
const KIND_FRACTION: u64 = 2;

/// Identifies a physical device across processes whatever their `CUDA_VISIBLE_DEVICES`: the
/// driver's UUID (`cuDeviceGetUuid_v2`), or [`DeviceId::ordinal`] where it cannot be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId(pub [u8; 16]);

impl DeviceId {
    /// Stands for "CUDA ordinal `d`" when the driver cannot name the device (such lines are
    /// shared only by processes that see the same devices under the same ordinals).
    pub fn ordinal(d: usize) -> DeviceId {
        let mut b = *b"ORDINAL:\0\0\0\0\0\0\0\0";
        b[8..].copy_from_slice(&(d as u64).to_le_bytes());
        DeviceId(b)
    }

    fn words(&self) -> [u64; 2] {
        let (a, b) = self.0.split_at(8);
        [
            u64::from_le_bytes(a.try_into().unwrap_or([0; 8])),
            u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        ]
    }

    fn from_words(w: [u64; 2]) -> DeviceId {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&w[0].to_le_bytes());
        b[8..].copy_from_slice(&w[1].to_le_bytes());
        DeviceId(b)
    }

    /// `GPU-xxxxxxxx` (the form nvidia-smi and CUDA_VISIBLE_DEVICES use, shortened) or
    /// `ordinal N`.
    pub fn short(&self) -> String {
        if self.0.starts_with(b"ORDINAL:") {
            let n = u64::from_le_bytes(self.0[8..].try_into().unwrap_or([0; 8]));
            return format!("ordinal {n}");
        }
        let hex: String = self.0[..4].iter().map(|b| format!("{b:02x}")).collect();
        format!("GPU-{hex}")
    }
}

const LINE_FREE: u64 = 0;
/// A line being claimed by a process that could not name itself (no `/proc`): never taken over.
const LINE_CLAIMING: u64 = 1;
const LINE_PUBLISHED: u64 = 2;
/// A line being claimed by the process whose [`ProcessKey`] is in the low bits (keys never
/// use bit 63, and a tagged key is never `LINE_FREE`, `LINE_CLAIMING` or `LINE_PUBLISHED`).
const CLAIMED_BY: u64 = 1 << 63;
/// How long a scan waits for a line a live process is claiming (two stores away from
/// published) before giving up on it (that process is stopped, or it was left mid-claim by a
/// process whose death cannot be told). A time, not a count of spins: with hundreds of
/// members starting at once on a few cores, the claimer can stay descheduled for far longer
/// than any fixed number of yields. A claim whose owner is dead is taken over at once.
const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// While waiting for a claim, the claimer's liveness is read again every this many yields.
const CLAIM_LIVENESS_EVERY: u32 = 256;

/// Test switches of [`Region::line_for_with`], each breaking or exercising one property.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineFaults {
    /// The process SIGKILLs itself between claiming a line and publishing it.
    pub die_after_claim: bool,
    /// A line left mid-claim by a dead process is never taken over (scans wait, then give up).
    pub no_recovery: bool,
}

/// Per-device counters, one cache line each.
#[repr(C, align(64))]
pub struct DeviceLine {
    total: AtomicU64,
    peak: AtomicU64,
    refusals: AtomicU64,
    claim: AtomicU64,
    identity: [AtomicU64; 2],
    /// Bumped (and its low half woken as a futex) when bytes come back while members wait.
    wake: AtomicU64,
    /// Members with a request waiting on this line (a hint for the free path: it may read
    /// low, never high, after a waiter is killed mid-bookkeeping; waiters also wake on a
    /// timer).
    waiters: AtomicU64,
}

/// Whether the process that left claim word `c` is surely gone (its pid does not exist, is a
/// zombie, or belongs to a process started at another time). An untagged claim (owner not
/// recorded) or an unreadable `/proc` entry never reads as dead.
fn claimer_is_dead(c: u64) -> bool {
    c & CLAIMED_BY != 0 && ProcessKey::from_word(c & !CLAIMED_BY).is_some_and(ProcessKey::is_dead)
}

impl DeviceLine {
    fn published_identity(&self) -> Option<DeviceId> {
        (self.claim.load(SeqCst) == LINE_PUBLISHED).then(|| {
            DeviceId::from_words([self.identity[0].load(SeqCst), self.identity[1].load(SeqCst)])
        })
    }
}

#[repr(C)]
pub struct Header {
    magic: AtomicU64,
    version: AtomicU64,
    layout_size: AtomicU64,
    max_devices: AtomicU64,
    max_slots: AtomicU64,
    creator_uid: AtomicU64,
    pid_ns: AtomicU64,
    created_unix: AtomicU64,
    cap_kind: [AtomicU64; MAX_DEVICES],
    cap_value: [AtomicU64; MAX_DEVICES],
    spec_text: [AtomicU64; SPEC_WORDS],
    needs_recount: AtomicU64,
    devices: [DeviceLine; MAX_DEVICES],
}

/// One process's slot.
#[repr(C, align(64))]
pub struct Slot {
    key: AtomicU64,
    inflight: AtomicU64,
    refusals: AtomicU64,
    start_ticks: AtomicU64,
    /// Identifies the program image that claimed the slot (0 = not set yet): after `exec`
    /// the pid and start time stay, the image (and its device memory) is new.
    image: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
    /// Bit `l`: a request of the owner waits on line `l` (`VRAMSHIM_ON_CAP=wait`).
    waiting: AtomicU64,
    /// CLOCK_MONOTONIC ns when the owner began waiting (orders the group's waiters).
    wait_since: AtomicU64,
}

#[repr(C)]
pub struct Layout {
    header: Header,
    slots: [Slot; MAX_SLOTS],
}

/// Size of the region file.
pub const LAYOUT_SIZE: usize = std::mem::size_of::<Layout>();

/// Why a region cannot be used. `Display` is the full one-line message (without the
/// "vramshim: " prefix and without what the caller does next).
#[derive(Debug)]
pub enum RegionError {
    Io {
        path: PathBuf,
        what: &'static str,
        err: io::Error,
    },
    NotFound {
        path: PathBuf,
    },
    NotOwned {
        path: PathBuf,
        owner: u32,
        me: u32,
    },
    Mode {
        path: PathBuf,
        mode: u32,
    },
    NotAFile {
        path: PathBuf,
    },
    Incompatible {
        path: PathBuf,
        why: String,
    },
    OtherNamespace {
        path: PathBuf,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Io { path, what, err } => {
                write!(
                    f,
                    "shared cap region {}: cannot {what}: {err}",
                    path.display()
                )
            }
            RegionError::NotFound { path } => {
                write!(f, "shared cap region {} does not exist", path.display())
            }
            RegionError::NotOwned { path, owner, me } => write!(
                f,
                "shared cap region {} belongs to uid {owner}, not to this user (uid {me}); refusing to use it",
                path.display()
            ),
            RegionError::Mode { path, mode } => write!(
                f,
                "shared cap region {} has mode {:o}, readable or writable by others; refusing to use it",
                path.display(),
                mode & 0o7777
            ),
            RegionError::NotAFile { path } => {
                write!(
                    f,
                    "shared cap region {} is not a regular file; refusing to use it",
                    path.display()
                )
            }
            RegionError::Incompatible { path, why } => write!(
                f,
                "shared cap region {} is not usable ({why}); not trusting it (remove it once no process uses it)",
                path.display()
            ),
            RegionError::OtherNamespace { path } => write!(
                f,
                "shared cap region {} was created in another pid namespace; its process slots cannot be checked from here",
                path.display()
            ),
        }
    }
}

/// Whether [`Region::open_or_create`] created the region or attached to an existing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    Created,
    Attached,
}

/// How a charge checks the cap. `Racy` is the classic bug (load, compare, store) kept only so
/// that tests can show the concurrency test catching it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Atomic,
    Racy,
}

/// A slot claimed by this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotIndex(pub usize);

/// What a reclaim pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Dead processes' slots freed.
    pub slots: usize,
    /// Bytes given back exactly.
    pub bytes: u64,
    /// Slots of processes killed mid-charge (their bytes were settled by a recount).
    pub ambiguous: usize,
    /// Devices whose total still waits for a recount (busy region; the next look retries).
    pub pending_recount: u64,
}

/// One process as seen in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSnapshot {
    pub slot: usize,
    pub pid: u32,
    pub start_ticks: u64,
    pub alive: bool,
    pub used: [u64; MAX_DEVICES],
    pub refusals: u64,
    /// The lines a request of the process waits on (bit per line; 0: not waiting).
    pub waiting: u64,
}

/// A consistent-enough copy of the region for display.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub caps: CapSpec,
    pub cap_text: String,
    pub creator_uid: u32,
    pub created_unix: u64,
    /// Which device each line counts (None: not claimed yet).
    pub identities: [Option<DeviceId>; MAX_DEVICES],
    pub totals: [u64; MAX_DEVICES],
    pub peaks: [u64; MAX_DEVICES],
    pub refusals: [u64; MAX_DEVICES],
    pub processes: Vec<ProcessSnapshot>,
}

/// A mapped region.
pub struct Region {
    map: sys::Mapping,
    path: Option<PathBuf>,
    /// Test switch: this process's frees never wake waiters ([`Region::set_no_wake`]).
    no_wake: std::sync::atomic::AtomicBool,
}

fn bytes_of(w: u64) -> u64 {
    w & MAX_BYTES
}

/// The next total word: the modification counter advances, bytes become `bytes`.
fn bump(w: u64, bytes: u64) -> u64 {
    ((w >> BYTES_BITS).wrapping_add(1) << BYTES_BITS) | (bytes & MAX_BYTES)
}

/// Atomically adds `bytes` to a total word if the result stays `<= cap`. Returns the new
/// total, or the total in use when refused. This is the reservation the cap rests on; the
/// private (single-process) cap uses it directly on a process-local word.
pub fn reserve(total: &AtomicU64, bytes: u64, cap: u64) -> Result<u64, u64> {
    let cap = cap.min(MAX_BYTES);
    let mut cur = total.load(Relaxed);
    loop {
        let used = bytes_of(cur);
        let next = match used.checked_add(bytes) {
            Some(n) if n <= cap => n,
            _ => return Err(used),
        };
        match total.compare_exchange_weak(cur, bump(cur, next), SeqCst, Relaxed) {
            Ok(_) => return Ok(next),
            Err(actual) => cur = actual,
        }
    }
}

/// The racy variant of [`reserve`] (load, check, store): loses updates and passes the cap
/// under contention. For tests that show the concurrency checks catch a broken reservation.
pub fn reserve_racy(total: &AtomicU64, bytes: u64, cap: u64) -> Result<u64, u64> {
    let cur = total.load(SeqCst);
    let used = bytes_of(cur);
    match used.checked_add(bytes) {
        Some(n) if n <= cap.min(MAX_BYTES) => {
            for _ in 0..200 {
                std::hint::spin_loop();
            }
            total.store(bump(cur, n), SeqCst);
            Ok(n)
        }
        _ => Err(used),
    }
}

/// Atomically subtracts up to `bytes` from a total word (never below zero).
pub fn release(total: &AtomicU64, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let mut cur = total.load(Relaxed);
    loop {
        let next = bytes_of(cur).saturating_sub(bytes);
        match total.compare_exchange_weak(cur, bump(cur, next), SeqCst, Relaxed) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

/// The bytes held in a total word.
pub fn total_bytes(total: &AtomicU64) -> u64 {
    bytes_of(total.load(Relaxed))
}

fn io_err<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(io::Error) -> RegionError + 'a {
    move |err| RegionError::Io {
        path: path.to_path_buf(),
        what,
        err,
    }
}

fn page_len() -> usize {
    LAYOUT_SIZE.div_ceil(4096) * 4096
}

impl Region {
    /// Opens the region at `path`, creating it with `caps` if it does not exist. A region that
    /// exists keeps its own caps (see [`Region::caps`]).
    pub fn open_or_create(path: &Path, caps: &CapSpec) -> Result<(Region, Opened), RegionError> {
        for _ in 0..8 {
            match Region::open(path) {
                Ok(r) => return Ok((r, Opened::Attached)),
                Err(RegionError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
            if let Some(r) = Region::create(path, caps)? {
                return Ok((r, Opened::Created));
            }
        }
        Err(RegionError::Incompatible {
            path: path.to_path_buf(),
            why: "it keeps appearing and disappearing".into(),
        })
    }

    /// Creates and publishes a new region; `None` if another process published one first.
    fn create(path: &Path, caps: &CapSpec) -> Result<Option<Region>, RegionError> {
        let map = create_published(path, page_len(), |m| {
            let region = Region::with_map(m, None);
            region.init(caps);
            region.map
        })?;
        Ok(map.map(|map| Region::with_map(map, Some(path.to_path_buf()))))
    }

    /// A private region in anonymous shared memory (tests, benchmarks; shared with children
    /// forked afterwards).
    pub fn anonymous(caps: &CapSpec) -> io::Result<Region> {
        let map = sys::Mapping::anonymous(page_len())?;
        let region = Region::with_map(map, None);
        region.init(caps);
        Ok(region)
    }

    fn with_map(map: sys::Mapping, path: Option<PathBuf>) -> Region {
        Region {
            map,
            path,
            no_wake: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn init(&self, caps: &CapSpec) {
        let h = &self.layout().header;
        h.version.store(VERSION, Relaxed);
        h.layout_size.store(LAYOUT_SIZE as u64, Relaxed);
        h.max_devices.store(MAX_DEVICES as u64, Relaxed);
        h.max_slots.store(MAX_SLOTS as u64, Relaxed);
        h.creator_uid.store(u64::from(sys::euid()), Relaxed);
        h.pid_ns.store(proc::pid_namespace(), Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        h.created_unix.store(now, Relaxed);
        for (d, c) in caps.devices.iter().enumerate() {
            let (kind, value) = match c {
                None => (KIND_NONE, 0),
                Some(CapValue::Bytes(b)) => (KIND_BYTES, (*b).min(MAX_BYTES)),
                Some(CapValue::Fraction(x)) => (KIND_FRACTION, x.to_bits()),
            };
            h.cap_kind[d].store(kind, Relaxed);
            h.cap_value[d].store(value, Relaxed);
        }
        let text = caps.to_text();
        let mut buf = [0u8; SPEC_WORDS * 8];
        let n = text.len().min(buf.len());
        buf[..n].copy_from_slice(&text.as_bytes()[..n]);
        for (i, w) in h.spec_text.iter().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i * 8..i * 8 + 8]);
            w.store(u64::from_le_bytes(b), Relaxed);
        }
        h.magic.store(MAGIC, SeqCst);
    }

    /// Opens an existing region (never creates one), verifying that it is ours and sound.
    pub fn open(path: &Path) -> Result<Region, RegionError> {
        let map = open_owned(path, page_len() as u64, describe_foreign)?;
        let region = Region::with_map(map, Some(path.to_path_buf()));
        region.verify(sys::euid())?;
        Ok(region)
    }

    fn verify(&self, me: u32) -> Result<(), RegionError> {
        let h = &self.layout().header;
        let bad = |why: String| {
            Err(RegionError::Incompatible {
                path: self.path.clone().unwrap_or_default(),
                why,
            })
        };
        let magic = h.magic.load(SeqCst);
        if magic != MAGIC {
            return bad(format!(
                "bad magic {magic:#018x}, not a vramshim cap region"
            ));
        }
        let version = h.version.load(Relaxed);
        if version != VERSION {
            return bad(format!(
                "layout version {version}, this library reads version {VERSION}"
            ));
        }
        let (ls, md, ms) = (
            h.layout_size.load(Relaxed),
            h.max_devices.load(Relaxed),
            h.max_slots.load(Relaxed),
        );
        if (ls, md, ms) != (LAYOUT_SIZE as u64, MAX_DEVICES as u64, MAX_SLOTS as u64) {
            return bad(format!(
                "layout of {ls} bytes, {md} devices, {ms} slots; expected {LAYOUT_SIZE}, {MAX_DEVICES}, {MAX_SLOTS}"
            ));
        }
        let uid = h.creator_uid.load(Relaxed);
        if uid != u64::from(me) {
            return bad(format!("created by uid {uid}"));
        }
        for d in 0..MAX_DEVICES {
            let (k, v) = (h.cap_kind[d].load(Relaxed), h.cap_value[d].load(Relaxed));
            let ok = match k {
                KIND_NONE => true,
                KIND_BYTES => v > 0 && v <= MAX_BYTES,
                KIND_FRACTION => {
                    let x = f64::from_bits(v);
                    x > 0.0 && x <= 1.0
                }
                _ => false,
            };
            if !ok {
                return bad(format!(
                    "device {d} has an invalid cap record ({k}, {v:#x})"
                ));
            }
        }
        let ns = h.pid_ns.load(Relaxed);
        let mine = proc::pid_namespace();
        if ns != 0 && mine != 0 && ns != mine {
            return Err(RegionError::OtherNamespace {
                path: self.path.clone().unwrap_or_default(),
            });
        }
        Ok(())
    }

    fn layout(&self) -> &Layout {
        self.map.view::<Layout>()
    }

    /// The file behind the region (None for an anonymous one).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The caps the region was created with.
    pub fn caps(&self) -> CapSpec {
        let h = &self.layout().header;
        let mut spec = CapSpec::none();
        for d in 0..MAX_DEVICES {
            let v = h.cap_value[d].load(Relaxed);
            spec.devices[d] = match h.cap_kind[d].load(Relaxed) {
                KIND_BYTES => Some(CapValue::Bytes(v)),
                KIND_FRACTION => Some(CapValue::Fraction(f64::from_bits(v))),
                _ => None,
            };
        }
        spec.all = spec
            .devices
            .iter()
            .all(|c| c.is_some() && *c == spec.devices[0]);
        spec
    }

    /// The canonical text of the caps the region was created with.
    pub fn cap_text(&self) -> String {
        let mut bytes = Vec::with_capacity(SPEC_WORDS * 8);
        for w in &self.layout().header.spec_text {
            bytes.extend_from_slice(&w.load(Relaxed).to_le_bytes());
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    fn device(&self, dev: usize) -> &DeviceLine {
        &self.layout().header.devices[dev]
    }

    fn slot(&self, s: SlotIndex) -> &Slot {
        &self.layout().slots[s.0]
    }

    /// The line counting device `id`, claiming a free one on first use. `None` when every
    /// line counts another device (more than [`MAX_DEVICES`] devices in one group), or a line
    /// stays mid-claim by a live process (stopped) for [`CLAIM_WAIT`]. A line left mid-claim
    /// by a process that died is taken over.
    pub fn line_for(&self, id: DeviceId) -> Option<usize> {
        self.line_for_with(id, LineFaults::default())
    }

    /// [`Region::line_for`] with test switches.
    pub fn line_for_with(&self, id: DeviceId, faults: LineFaults) -> Option<usize> {
        let want = id.words();
        let mine = ProcessKey::current().map_or(LINE_CLAIMING, |k| CLAIMED_BY | k.word());
        for (i, line) in self.layout().header.devices.iter().enumerate() {
            let mut waiting_since: Option<std::time::Instant> = None;
            let mut yields = 0u32;
            loop {
                let c = line.claim.load(SeqCst);
                let took = match c {
                    LINE_PUBLISHED => break,
                    LINE_FREE => line
                        .claim
                        .compare_exchange(LINE_FREE, mine, SeqCst, SeqCst)
                        .is_ok(),
                    _ if !faults.no_recovery
                        && yields.is_multiple_of(CLAIM_LIVENESS_EVERY)
                        && claimer_is_dead(c) =>
                    {
                        // Its owner died between claiming and publishing: nothing was charged
                        // on the line yet, so it is taken over as if it were free.
                        line.claim.compare_exchange(c, mine, SeqCst, SeqCst).is_ok()
                    }
                    _ => {
                        let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
                        if since.elapsed() > CLAIM_WAIT {
                            return None;
                        }
                        yields = yields.wrapping_add(1);
                        std::thread::yield_now();
                        false
                    }
                };
                if !took {
                    continue;
                }
                if faults.die_after_claim {
                    sys::kill_self();
                }
                line.identity[0].store(want[0], SeqCst);
                line.identity[1].store(want[1], SeqCst);
                // A CAS, not a store: had the claim been taken over (its owner judged dead),
                // the line is the taker's.
                if line
                    .claim
                    .compare_exchange(mine, LINE_PUBLISHED, SeqCst, SeqCst)
                    .is_ok()
                {
                    return Some(i);
                }
            }
            if line.published_identity() == Some(id) {
                return Some(i);
            }
        }
        None
    }

    /// Bytes charged on line `dev` by every process sharing the region.
    pub fn in_use(&self, dev: usize) -> u64 {
        self.layout()
            .header
            .devices
            .get(dev)
            .map_or(0, |d| total_bytes(&d.total))
    }

    /// Bytes this slot holds on `dev`.
    pub fn slot_used(&self, s: SlotIndex, dev: usize) -> u64 {
        self.slot(s).used.get(dev).map_or(0, |u| u.load(Relaxed))
    }

    /// Claims a free slot for `me`. `None` when all [`MAX_SLOTS`] are taken (after a reclaim).
    pub fn claim_slot(&self, me: ProcessKey, start_ticks: u64) -> Option<SlotIndex> {
        for (i, s) in self.layout().slots.iter().enumerate() {
            if s.key.load(Relaxed) == 0
                && s.key
                    .compare_exchange(0, me.word(), SeqCst, Relaxed)
                    .is_ok()
            {
                s.start_ticks.store(start_ticks, Relaxed);
                s.refusals.store(0, Relaxed);
                s.waiting.store(0, SeqCst);
                s.wait_since.store(0, Relaxed);
                return Some(SlotIndex(i));
            }
        }
        None
    }

    /// Records which program image holds slot `s` (see [`Region::reclaim_replaced_images`]).
    pub fn set_image(&self, s: SlotIndex, image: u64) {
        self.slot(s).image.store(image, SeqCst);
    }

    /// Frees the slots this very process (same pid and start time) claimed before an `exec`
    /// replaced its program image (and the driver freed its device memory): slots with our
    /// key whose image is set and differs from `image`.
    pub fn reclaim_replaced_images(&self, me: ProcessKey, image: u64) -> Reclaimed {
        let mut out = Reclaimed::default();
        for s in self.layout().slots.iter() {
            let k = s.key.load(SeqCst);
            let theirs = s.image.load(SeqCst);
            if k != me.word() || theirs == 0 || theirs == image {
                continue;
            }
            if s.key
                .compare_exchange(k, REAP_FLAG | me.word(), SeqCst, Relaxed)
                .is_err()
            {
                continue;
            }
            self.reap(s, k, &mut out);
            out.slots += 1;
        }
        if out.ambiguous > 0 {
            // Settle the totals (reclaims nothing else: everyone counts as alive).
            out.pending_recount = self.reclaim_with(me, &|_| true).pending_recount;
        }
        out
    }

    /// Frees this process's slot, giving back what it holds (a clean exit; a dead process's
    /// slot is freed by [`Region::reclaim`] instead).
    pub fn release_slot(&self, s: SlotIndex) {
        let slot = self.slot(s);
        slot.inflight.fetch_add(1, SeqCst);
        self.drop_waits(slot);
        for (d, u) in slot.used.iter().enumerate() {
            let b = u.swap(0, SeqCst);
            release(&self.device(d).total, b);
            if b > 0 {
                self.wake_line(d);
            }
        }
        slot.inflight.store(0, SeqCst);
        slot.image.store(0, SeqCst);
        slot.key.store(0, SeqCst);
    }

    /// Reserves `bytes` on `dev` for slot `s` if the shared total stays within `cap`.
    /// Returns the new total, or the total in use when refused (nothing changes then).
    pub fn charge(
        &self,
        s: SlotIndex,
        dev: usize,
        bytes: u64,
        cap: u64,
        check: Check,
    ) -> Result<u64, u64> {
        let (Some(line), slot) = (self.layout().header.devices.get(dev), self.slot(s)) else {
            return Err(0);
        };
        slot.inflight.fetch_add(1, SeqCst);
        let r = match check {
            Check::Atomic => reserve(&line.total, bytes, cap),
            Check::Racy => reserve_racy(&line.total, bytes, cap),
        };
        if let Ok(total) = r {
            slot.used[dev].fetch_add(bytes, SeqCst);
            if line.peak.load(Relaxed) < total {
                line.peak.fetch_max(total, Relaxed);
            }
        }
        slot.inflight.fetch_sub(1, SeqCst);
        r
    }

    /// Gives back up to `bytes` held by slot `s` on `dev` (never more than the slot holds).
    /// Returns what was given back.
    pub fn uncharge(&self, s: SlotIndex, dev: usize, bytes: u64) -> u64 {
        let (Some(line), slot) = (self.layout().header.devices.get(dev), self.slot(s)) else {
            return 0;
        };
        slot.inflight.fetch_add(1, SeqCst);
        let prev = slot.used[dev]
            .fetch_update(SeqCst, SeqCst, |u| Some(u.saturating_sub(bytes)))
            .unwrap_or(0);
        let taken = prev.min(bytes);
        release(&line.total, taken);
        slot.inflight.fetch_sub(1, SeqCst);
        // One load of a word on the line just written; a syscall only while members wait.
        if line.waiters.load(SeqCst) != 0 {
            self.wake_line(dev);
        }
        taken
    }

    /// Counts a refusal for slot `s` on `dev`.
    pub fn note_refusal(&self, s: SlotIndex, dev: usize) {
        if let Some(line) = self.layout().header.devices.get(dev) {
            line.refusals.fetch_add(1, Relaxed);
        }
        self.slot(s).refusals.fetch_add(1, Relaxed);
    }

    /// Frees the slots of dead processes, giving their bytes back (see the module docs).
    /// `me` identifies the caller while it holds a slot being reclaimed.
    pub fn reclaim(&self, me: ProcessKey) -> Reclaimed {
        self.reclaim_with(me, &|k| k.alive(true))
    }

    /// [`Region::reclaim`] with a custom liveness test (tests use it to break the start-time
    /// check and show the pid-reuse test catching it).
    pub fn reclaim_with(&self, me: ProcessKey, alive: &dyn Fn(ProcessKey) -> bool) -> Reclaimed {
        let mut out = Reclaimed::default();
        let lay = self.layout();
        for s in lay.slots.iter() {
            let k = s.key.load(SeqCst);
            let Some(owner) = ProcessKey::from_word(k) else {
                continue;
            };
            if owner == me || alive(owner) {
                continue;
            }
            if s.key
                .compare_exchange(k, REAP_FLAG | me.word(), SeqCst, Relaxed)
                .is_err()
            {
                continue;
            }
            self.reap(s, k, &mut out);
            out.slots += 1;
        }
        if lay.header.needs_recount.load(SeqCst) != 0 {
            for _ in 0..16 {
                if self.recount() == 0 {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        out.pending_recount = lay.header.needs_recount.load(SeqCst);
        out
    }

    /// Frees slot `s` that the caller took over (its key was `k`), giving its bytes back.
    fn reap(&self, s: &Slot, k: u64, out: &mut Reclaimed) {
        let lay = self.layout();
        // A waiter killed while waiting: its marks go (its wait is over).
        self.drop_waits(s);
        if s.inflight.load(SeqCst) == 0 && k & REAP_FLAG == 0 {
            // The owner finished every operation: its slot is exact.
            s.inflight.store(1, SeqCst);
            for (d, u) in s.used.iter().enumerate() {
                let b = u.swap(0, SeqCst);
                if b > 0 {
                    release(&lay.header.devices[d].total, b);
                    out.bytes += b;
                    self.wake_line(d);
                }
            }
        } else {
            // Killed between the two halves of an operation (or a reclaimer killed while
            // reclaiming): whether the total holds its last operation is unknown. Drop the
            // slot's bytes and let a recount settle the totals.
            let mut mask = 0;
            for (d, u) in s.used.iter().enumerate() {
                u.store(0, SeqCst);
                mask |= 1 << d;
            }
            lay.header.needs_recount.fetch_or(mask, SeqCst);
            out.ambiguous += 1;
        }
        s.refusals.store(0, Relaxed);
        s.start_ticks.store(0, Relaxed);
        s.image.store(0, Relaxed);
        s.inflight.store(0, SeqCst);
        s.key.store(0, SeqCst);
    }

    /// Sets each device marked for a recount to the sum of its slots, if no slot is in the
    /// middle of an operation or a reclaim and no total moved during the scan. Returns the
    /// devices still marked.
    fn recount(&self) -> u64 {
        let lay = self.layout();
        let mask = lay.header.needs_recount.load(SeqCst);
        if mask == 0 {
            return 0;
        }
        let before: Vec<u64> = lay
            .header
            .devices
            .iter()
            .map(|d| d.total.load(SeqCst))
            .collect();
        let mut sums = [0u64; MAX_DEVICES];
        for s in lay.slots.iter() {
            let k = s.key.load(SeqCst);
            if k == 0 {
                continue;
            }
            if k & REAP_FLAG != 0 || s.inflight.load(SeqCst) != 0 {
                return mask;
            }
            for (d, u) in s.used.iter().enumerate() {
                sums[d] = sums[d].saturating_add(u.load(SeqCst));
            }
        }
        for d in 0..MAX_DEVICES {
            if mask & (1 << d) == 0 {
                continue;
            }
            let line = &lay.header.devices[d];
            if line
                .total
                .compare_exchange(before[d], bump(before[d], sums[d]), SeqCst, Relaxed)
                .is_ok()
            {
                lay.header.needs_recount.fetch_and(!(1 << d), SeqCst);
                self.wake_line(d);
            }
        }
        lay.header.needs_recount.load(SeqCst)
    }

    /// A copy of the region for display (`vramshim top`).
    pub fn snapshot(&self) -> Snapshot {
        let lay = self.layout();
        let h = &lay.header;
        let mut processes = Vec::new();
        for (i, s) in lay.slots.iter().enumerate() {
            let Some(k) = ProcessKey::from_word(s.key.load(SeqCst)) else {
                continue;
            };
            let mut used = [0; MAX_DEVICES];
            for (d, u) in s.used.iter().enumerate() {
                used[d] = u.load(Relaxed);
            }
            processes.push(ProcessSnapshot {
                slot: i,
                pid: k.pid(),
                start_ticks: s.start_ticks.load(Relaxed),
                alive: k.alive(true),
                used,
                refusals: s.refusals.load(Relaxed),
                waiting: s.waiting.load(Relaxed),
            });
        }
        let per = |f: &dyn Fn(&DeviceLine) -> u64| {
            let mut a = [0; MAX_DEVICES];
            for (d, line) in h.devices.iter().enumerate() {
                a[d] = f(line);
            }
            a
        };
        let mut identities = [None; MAX_DEVICES];
        for (d, line) in h.devices.iter().enumerate() {
            identities[d] = line.published_identity();
        }
        Snapshot {
            caps: self.caps(),
            cap_text: self.cap_text(),
            creator_uid: h.creator_uid.load(Relaxed) as u32,
            created_unix: h.created_unix.load(Relaxed),
            identities,
            totals: per(&|l| total_bytes(&l.total)),
            peaks: per(&|l| l.peak.load(Relaxed)),
            refusals: per(&|l| l.refusals.load(Relaxed)),
            processes,
        }
    }
}

/// Creates a shared file of `len` bytes at `path` (mode 0600), lets `init` fill it through its
/// mapping, and publishes it under `path` with `link()` (atomic: nobody ever sees a
/// half-initialised file). `None` if another process published one first. Used for the cap
/// region and the node registry alike.
pub(crate) fn create_published(
    path: &Path,
    len: usize,
    init: impl FnOnce(sys::Mapping) -> sys::Mapping,
) -> Result<Option<sys::Mapping>, RegionError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".{base}.{}.{nanos}.tmp", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io_err(path, "create it"))?;
    let result = (|| {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io_err(path, "set its mode"))?;
        file.set_len(len as u64).map_err(io_err(path, "size it"))?;
        let map = sys::Mapping::file(&file, len).map_err(io_err(path, "map it"))?;
        let map = init(map);
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(Some(map)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(RegionError::Io {
                path: path.to_path_buf(),
                what: "publish it",
                err: e,
            }),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Opens and maps an existing shared file of exactly `len` bytes: never following a link,
/// never blocking on a FIFO, and refusing anything but a regular file owned by us without
/// group/other mode bits. `foreign` says why a file of another size is not ours.
pub(crate) fn open_owned(
    path: &Path,
    len: u64,
    foreign: fn(&mut File, u64) -> String,
) -> Result<sys::Mapping, RegionError> {
    let pb = || path.to_path_buf();
    let mut file = match OpenOptions::new()
        .read(true)
        .write(true)
        // Never follow a link another user planted, never block on a FIFO: the type,
        // owner and mode are checked on the open file below.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(RegionError::NotFound { path: pb() });
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(RegionError::NotAFile { path: pb() });
        }
        Err(e) => {
            return Err(RegionError::Io {
                path: pb(),
                what: "open it",
                err: e,
            });
        }
    };
    let meta = file.metadata().map_err(io_err(path, "stat it"))?;
    if !meta.is_file() {
        return Err(RegionError::NotAFile { path: pb() });
    }
    let me = sys::euid();
    if meta.uid() != me {
        return Err(RegionError::NotOwned {
            path: pb(),
            owner: meta.uid(),
            me,
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(RegionError::Mode {
            path: pb(),
            mode: meta.mode(),
        });
    }
    if meta.len() != len {
        return Err(RegionError::Incompatible {
            path: pb(),
            why: foreign(&mut file, meta.len()),
        });
    }
    sys::Mapping::file(&file, len as usize).map_err(io_err(path, "map it"))
}

/// Why a file of the wrong size is not ours: read its first words.
fn describe_foreign(file: &mut File, len: u64) -> String {
    let mut buf = [0u8; 16];
    if len >= 16 && file.read_exact(&mut buf).is_ok() {
        let magic = u64::from_le_bytes(buf[..8].try_into().unwrap_or([0; 8]));
        let version = u64::from_le_bytes(buf[8..].try_into().unwrap_or([0; 8]));
        if magic == MAGIC {
            return format!(
                "layout version {version} of {len} bytes, this library reads version {VERSION} of {} bytes",
                page_len()
            );
        }
        return format!("{len} bytes without the vramshim magic, not a vramshim cap region");
    }
    format!("{len} bytes, expected {}", page_len())
}

#[cfg(test)]
mod tests;
