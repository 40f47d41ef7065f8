//! The node registry: every process running under `libvramshim.so` has a slot in one shared
//! file per node and user, `/dev/shm/vramshim-registry-<uid>` (or the path of
//! `VRAMSHIM_REGISTRY`), read by `vramshim top` and `vramshim exporter`.
//!
//! # Layout (version 1)
//! A header (magic, version, layout size, slot count, creator uid, pid namespace, creation
//! time) and [`REG_SLOTS`] slots of one process each: its [`ProcessKey`] (pid + start time), uid,
//! command name, shared group (`VRAMSHIM_SHARED`), container/pod identity (from its cgroup), the
//! process-wide refusal and OOM counts, flags, and one line per device it used (CUDA ordinal,
//! UUID, cap, its group's cap, bytes in use, peak, bytes the pool reserves). The group's cap
//! came after the rest, in a padding word: [`FLAG_GROUP_CAP`] says a slot's writer fills it.
//!
//! # Protocol (no lock; nothing on the allocation path)
//! - Register: a slot whose key is this process (a previous program image after `exec`), else
//!   a free slot, else a slot whose owner is dead (no such pid, a zombie, or another start time:
//!   SIGKILL leaves its slot behind) is taken by CAS of its key to `CLAIMING | me`; its fields
//!   are rewritten and the key is then stored as `me` (published). Readers skip slots being
//!   claimed, so nobody sees one process's identity with another's numbers.
//! - Publish: the owner's publisher thread copies the counters the process keeps anyway into its
//!   slot with relaxed stores, periodically; nothing is added to an allocation.
//! - Leave: at exit the key is set back to 0 (CAS from `me`). A killed process's slot reads as
//!   dead (its pid + start time no longer run) and is reused by the next registration.
//!
//! The file follows the cap region's rules: created with `O_EXCL` and published by `link()`,
//! opened with `O_NOFOLLOW`, refused unless a regular file of the user, mode without group/other
//! bits, of the exact size, magic, version, uid and pid namespace.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use crate::proc::{self, ProcessKey};
use crate::{DeviceId, MAX_DEVICES, REAP_FLAG, RegionError, sys};

/// "VRSHMREG", little-endian.
pub const REG_MAGIC: u64 = u64::from_le_bytes(*b"VRSHMREG");
/// Layout version; a registry of another version is refused, never reinterpreted.
pub const REG_VERSION: u64 = 1;
/// Processes one registry holds at a time (a registration past it is refused and said once).
pub const REG_SLOTS: usize = 1024;
/// A slot whose key has this bit is being claimed (readers skip it).
const CLAIMING: u64 = REAP_FLAG;
/// Bit of [`Registered::flags`]: a request of the process is waiting for its shared cap.
pub const FLAG_WAITING: u64 = 1;
/// Bit of [`Registered::flags`]: the slot's writer publishes each device's group cap
/// ([`DeviceRecord::group_cap`]). A library from before that word was used never sets this bit
/// (it stores 0 at registration and only [`FLAG_WAITING`] after), nor writes the word, which
/// may then hold a previous owner's value: without the bit the group cap is unknown, not
/// absent. [`Registry::register`] and [`Registry::publish_process`] set it themselves.
pub const FLAG_GROUP_CAP: u64 = 2;

#[repr(C, align(64))]
struct RegHeader {
    magic: AtomicU64,
    version: AtomicU64,
    layout_size: AtomicU64,
    slots: AtomicU64,
    creator_uid: AtomicU64,
    pid_ns: AtomicU64,
    created_unix: AtomicU64,
    _pad: AtomicU64,
}

/// One device of one process, one cache line.
#[repr(C, align(64))]
struct RegDevice {
    /// CUDA ordinal + 1 (0: the line is unused).
    ordinal: AtomicU64,
    uuid: [AtomicU64; 2],
    cap: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    pool_reserved: AtomicU64,
    /// The group's cap + 1 (0: none). Padding to a writer from before this word was used,
    /// which neither writes nor clears it: read only where the slot has [`FLAG_GROUP_CAP`].
    group_cap: AtomicU64,
}

#[repr(C, align(64))]
struct RegSlot {
    key: AtomicU64,
    start_ticks: AtomicU64,
    uid: AtomicU64,
    flags: AtomicU64,
    refusals: AtomicU64,
    ooms: AtomicU64,
    /// Unix time in milliseconds of the owner's last publication.
    updated_ms: AtomicU64,
    runtime: AtomicU64,
    cmd: [AtomicU64; 2],
    _pad: [AtomicU64; 6],
    group: [AtomicU64; 8],
    container: [AtomicU64; 8],
    pod: [AtomicU64; 6],
    _pad2: [AtomicU64; 2],
    devices: [RegDevice; MAX_DEVICES],
}

#[repr(C)]
struct RegLayout {
    header: RegHeader,
    slots: [RegSlot; REG_SLOTS],
}

/// Size of the registry file.
pub const REG_LAYOUT_SIZE: usize = std::mem::size_of::<RegLayout>();

fn reg_len() -> usize {
    REG_LAYOUT_SIZE.div_ceil(4096) * 4096
}

/// `/dev/shm/vramshim-registry-<uid>`: the node's registry of user `uid`.
pub fn default_path(uid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/vramshim-registry-{uid}"))
}

/// Why a registry cannot be used: the cap region's reasons, named for the registry.
#[derive(Debug)]
pub struct RegistryError(pub RegionError);

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.to_string();
        f.write_str(&text.replacen("shared cap region", "node registry", 1))
    }
}

impl std::error::Error for RegistryError {}

/// The container runtime a cgroup path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Runtime {
    #[default]
    None,
    Docker,
    Containerd,
    Crio,
    Podman,
    Kubepods,
}

impl Runtime {
    const ALL: [Runtime; 6] = [
        Runtime::None,
        Runtime::Docker,
        Runtime::Containerd,
        Runtime::Crio,
        Runtime::Podman,
        Runtime::Kubepods,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Runtime::None => "",
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::Crio => "cri-o",
            Runtime::Podman => "podman",
            Runtime::Kubepods => "kubepods",
        }
    }

    fn word(self) -> u64 {
        Runtime::ALL.iter().position(|r| *r == self).unwrap_or(0) as u64
    }

    fn from_word(w: u64) -> Runtime {
        Runtime::ALL
            .get(usize::try_from(w).unwrap_or(0))
            .copied()
            .unwrap_or_default()
    }
}

/// A process's container and pod, as its cgroup path names them (empty where it does not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container {
    pub runtime: Runtime,
    /// The container id (64 hex digits as the runtime writes it).
    pub id: String,
    /// The Kubernetes pod UID (with dashes), under `kubepods`.
    pub pod_uid: String,
}

fn is_hex_id(s: &str) -> bool {
    s.len() >= 12 && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Reads a process's container identity from the text of `/proc/<pid>/cgroup`. Understands the
/// cgroupfs and systemd forms of Docker (`/docker/<id>`, `docker-<id>.scope`), containerd
/// (`cri-containerd-<id>.scope`, `/containerd/<id>`), CRI-O (`crio-<id>.scope`), Podman
/// (`libpod-<id>.scope`) and Kubernetes (`kubepods[-class]-pod<uid>.slice`,
/// `/kubepods/<class>/pod<uid>/<id>`). The last matching component wins (the innermost).
pub fn parse_cgroup(text: &str) -> Container {
    let mut out = Container::default();
    for line in text.lines().take(64) {
        // hierarchy-id:controllers:path
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let mut in_kubepods = false;
        let mut after_docker = None::<Runtime>;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            if comp == "kubepods" || comp.starts_with("kubepods.") || comp.starts_with("kubepods-")
            {
                in_kubepods = true;
            }
            if let Some(i) = comp.rfind("pod")
                && in_kubepods
            {
                let rest = comp[i + 3..].trim_end_matches(".slice");
                let uid = rest.replace('_', "-");
                if uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
                    out.pod_uid = uid;
                    if out.runtime == Runtime::None {
                        out.runtime = Runtime::Kubepods;
                    }
                }
            }
            let scoped = |prefix: &str| {
                comp.strip_prefix(prefix)
                    .map(|r| r.trim_end_matches(".scope"))
                    .filter(|r| is_hex_id(r))
                    .map(str::to_string)
            };
            let found = [
                ("docker-", Runtime::Docker),
                ("cri-containerd-", Runtime::Containerd),
                ("crio-", Runtime::Crio),
                ("libpod-", Runtime::Podman),
            ]
            .iter()
            .find_map(|(p, r)| scoped(p).map(|id| (*r, id)));
            if let Some((r, id)) = found {
                out.runtime = r;
                out.id = id;
            } else if let Some(r) = after_docker.take()
                && is_hex_id(comp)
            {
                out.runtime = r;
                out.id = comp.to_string();
            } else if in_kubepods && is_hex_id(comp) && comp.len() == 64 {
                // cgroupfs driver: /kubepods/<class>/pod<uid>/<container id>
                out.id = comp.to_string();
                if out.runtime == Runtime::None {
                    out.runtime = Runtime::Kubepods;
                }
            }
            after_docker = match comp {
                "docker" => Some(Runtime::Docker),
                "containerd" => Some(Runtime::Containerd),
                _ => None,
            };
        }
    }
    out
}

/// What a process says about itself once, at registration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub start_ticks: u64,
    /// The command name (`/proc/<pid>/comm`, at most 16 bytes).
    pub cmd: String,
    /// `VRAMSHIM_SHARED` (empty: not in a group).
    pub group: String,
    pub container: Container,
}

/// One device's numbers, as published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceRecord {
    pub ordinal: u32,
    /// The driver's UUID (None: not known yet).
    pub uuid: Option<DeviceId>,
    /// The cap that binds the process, in bytes (None: uncapped): its own, or in a
    /// `VRAMSHIM_SHARED` group the smaller of the group's and the member's own.
    pub cap: Option<u64>,
    /// The cap of the process's `VRAMSHIM_SHARED` group, in bytes (None: not in a group, or
    /// the group is uncapped on the device; as read, also where the writer does not say, see
    /// [`Registered::group_cap_known`]).
    pub group_cap: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub pool_reserved: u64,
}

/// One registered process, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registered {
    pub slot: usize,
    pub pid: u32,
    pub identity: Identity,
    pub flags: u64,
    pub refusals: u64,
    pub ooms: u64,
    pub updated_ms: u64,
    pub devices: Vec<DeviceRecord>,
}

impl Registered {
    /// Whether the devices' [`DeviceRecord::group_cap`] says the truth: false for a process
    /// whose library predates the group cap (its `None` there means unknown, not uncapped).
    pub fn group_cap_known(&self) -> bool {
        self.flags & FLAG_GROUP_CAP != 0
    }
}

/// A slot this process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegSlotIndex(pub usize);

/// A mapped registry.
pub struct Registry {
    map: sys::Mapping,
    path: Option<PathBuf>,
}

fn store_text(words: &[AtomicU64], text: &str) {
    let mut buf = vec![0u8; words.len() * 8];
    // Cut at a character boundary so that what is read back is valid text.
    let mut n = text.len().min(buf.len());
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
    for (w, c) in words.iter().zip(buf.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        w.store(u64::from_le_bytes(b), Relaxed);
    }
}

fn load_text(words: &[AtomicU64]) -> String {
    let mut buf = Vec::with_capacity(words.len() * 8);
    for w in words {
        buf.extend_from_slice(&w.load(Relaxed).to_le_bytes());
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn describe_foreign(file: &mut std::fs::File, len: u64) -> String {
    use std::io::Read;
    let mut buf = [0u8; 16];
    if len >= 16 && file.read_exact(&mut buf).is_ok() {
        let magic = u64::from_le_bytes(buf[..8].try_into().unwrap_or([0; 8]));
        let version = u64::from_le_bytes(buf[8..].try_into().unwrap_or([0; 8]));
        if magic == REG_MAGIC {
            return format!(
                "registry version {version} of {len} bytes, this library reads version {REG_VERSION} of {} bytes",
                reg_len()
            );
        }
        return format!("{len} bytes without the vramshim registry magic, not a vramshim registry");
    }
    format!("{len} bytes, expected {}", reg_len())
}

impl Registry {
    /// Opens the registry at `path`, creating it if it does not exist.
    pub fn open_or_create(path: &Path) -> Result<Registry, RegistryError> {
        for _ in 0..8 {
            match Registry::open(path) {
                Ok(r) => return Ok(r),
                Err(RegistryError(RegionError::NotFound { .. })) => {}
                Err(e) => return Err(e),
            }
            let made = crate::create_published(path, reg_len(), |m| {
                let r = Registry { map: m, path: None };
                r.init();
                r.map
            })
            .map_err(RegistryError)?;
            if let Some(map) = made {
                return Ok(Registry {
                    map,
                    path: Some(path.to_path_buf()),
                });
            }
        }
        Err(RegistryError(RegionError::Incompatible {
            path: path.to_path_buf(),
            why: "it keeps appearing and disappearing".into(),
        }))
    }

    /// Opens an existing registry (never creates one), verifying that it is ours and sound.
    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        let map =
            crate::open_owned(path, reg_len() as u64, describe_foreign).map_err(RegistryError)?;
        let r = Registry {
            map,
            path: Some(path.to_path_buf()),
        };
        r.verify().map_err(RegistryError)?;
        Ok(r)
    }

    /// A private registry in anonymous shared memory (tests, benchmarks; shared with children
    /// forked afterwards).
    pub fn anonymous() -> io::Result<Registry> {
        let map = sys::Mapping::anonymous(reg_len())?;
        let r = Registry { map, path: None };
        r.init();
        Ok(r)
    }

    /// The file behind the registry (None for an anonymous one).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn layout(&self) -> &RegLayout {
        self.map.view::<RegLayout>()
    }

    fn init(&self) {
        let h = &self.layout().header;
        h.version.store(REG_VERSION, Relaxed);
        h.layout_size.store(REG_LAYOUT_SIZE as u64, Relaxed);
        h.slots.store(REG_SLOTS as u64, Relaxed);
        h.creator_uid.store(u64::from(sys::euid()), Relaxed);
        h.pid_ns.store(proc::pid_namespace(), Relaxed);
        h.created_unix.store(now_ms() / 1000, Relaxed);
        h.magic.store(REG_MAGIC, SeqCst);
    }

    fn verify(&self) -> Result<(), RegionError> {
        let h = &self.layout().header;
        let path = || self.path.clone().unwrap_or_default();
        let bad = |why: String| Err(RegionError::Incompatible { path: path(), why });
        let magic = h.magic.load(SeqCst);
        if magic != REG_MAGIC {
            return bad(format!("bad magic {magic:#018x}, not a vramshim registry"));
        }
        let version = h.version.load(Relaxed);
        if version != REG_VERSION {
            return bad(format!(
                "registry version {version}, this library reads version {REG_VERSION}"
            ));
        }
        let (ls, n) = (h.layout_size.load(Relaxed), h.slots.load(Relaxed));
        if (ls, n) != (REG_LAYOUT_SIZE as u64, REG_SLOTS as u64) {
            return bad(format!(
                "layout of {ls} bytes, {n} slots; expected {REG_LAYOUT_SIZE}, {REG_SLOTS}"
            ));
        }
        let uid = h.creator_uid.load(Relaxed);
        if uid != u64::from(sys::euid()) {
            return bad(format!("created by uid {uid}"));
        }
        let ns = h.pid_ns.load(Relaxed);
        let mine = proc::pid_namespace();
        if ns != 0 && mine != 0 && ns != mine {
            return Err(RegionError::OtherNamespace { path: path() });
        }
        Ok(())
    }

    /// Registers process `me` (see the module docs). `None` when every slot is held by a live
    /// process.
    pub fn register(&self, me: ProcessKey, id: &Identity) -> Option<RegSlotIndex> {
        self.register_with(me, id, &|k| k.alive(true))
    }

    /// [`Registry::register`] with a custom liveness test (tests use it to break the start-time
    /// check and show the pid-reuse test catching it).
    pub fn register_with(
        &self,
        me: ProcessKey,
        id: &Identity,
        alive: &dyn Fn(ProcessKey) -> bool,
    ) -> Option<RegSlotIndex> {
        let slots = &self.layout().slots;
        let mine = me.word();
        // A slot of this very process (its previous program image, before `exec`) first, then
        // a free one, then a dead owner's.
        let pick = slots
            .iter()
            .position(|s| s.key.load(SeqCst) & !CLAIMING == mine)
            .and_then(|i| {
                let k = slots[i].key.load(SeqCst);
                (k & !CLAIMING == mine)
                    .then(|| {
                        slots[i]
                            .key
                            .compare_exchange(k, CLAIMING | mine, SeqCst, Relaxed)
                    })
                    .and_then(|r| r.ok())
                    .map(|_| i)
            })
            .or_else(|| {
                slots.iter().position(|s| {
                    s.key
                        .compare_exchange(0, CLAIMING | mine, SeqCst, Relaxed)
                        .is_ok()
                })
            })
            .or_else(|| {
                slots.iter().position(|s| {
                    let k = s.key.load(SeqCst);
                    match ProcessKey::from_word(k) {
                        Some(owner) if owner != me && !alive(owner) => s
                            .key
                            .compare_exchange(k, CLAIMING | mine, SeqCst, Relaxed)
                            .is_ok(),
                        _ => false,
                    }
                })
            })?;
        let s = &slots[pick];
        s.start_ticks.store(id.start_ticks, Relaxed);
        s.uid.store(u64::from(id.uid), Relaxed);
        s.flags.store(FLAG_GROUP_CAP, Relaxed);
        s.refusals.store(0, Relaxed);
        s.ooms.store(0, Relaxed);
        s.updated_ms.store(now_ms(), Relaxed);
        s.runtime.store(id.container.runtime.word(), Relaxed);
        store_text(&s.cmd, &id.cmd);
        store_text(&s.group, &id.group);
        store_text(&s.container, &id.container.id);
        store_text(&s.pod, &id.container.pod_uid);
        for d in &s.devices {
            d.ordinal.store(0, Relaxed);
            for w in [
                &d.uuid[0],
                &d.uuid[1],
                &d.cap,
                &d.used,
                &d.peak,
                &d.pool_reserved,
                &d.group_cap,
            ] {
                w.store(0, Relaxed);
            }
        }
        s.key.store(mine, SeqCst);
        Some(RegSlotIndex(pick))
    }

    /// Publishes device line `line` (0..[`MAX_DEVICES`]) of slot `s`. Relaxed stores: readers
    /// see each number whole, the line as a whole approximately (it is a gauge).
    pub fn publish_device(&self, s: RegSlotIndex, line: usize, rec: &DeviceRecord) {
        let Some(d) = self.layout().slots[s.0].devices.get(line) else {
            return;
        };
        let [a, b] = rec.uuid.map_or([0, 0], |u| u.words());
        d.uuid[0].store(a, Relaxed);
        d.uuid[1].store(b, Relaxed);
        d.cap
            .store(rec.cap.map_or(0, |c| c.saturating_add(1)), Relaxed);
        d.group_cap
            .store(rec.group_cap.map_or(0, |c| c.saturating_add(1)), Relaxed);
        d.used.store(rec.used, Relaxed);
        d.peak.store(rec.peak, Relaxed);
        d.pool_reserved.store(rec.pool_reserved, Relaxed);
        d.ordinal.store(u64::from(rec.ordinal) + 1, Relaxed);
    }

    /// Publishes the process-wide numbers of slot `s`.
    pub fn publish_process(&self, s: RegSlotIndex, refusals: u64, ooms: u64, flags: u64) {
        let slot = &self.layout().slots[s.0];
        slot.refusals.store(refusals, Relaxed);
        slot.ooms.store(ooms, Relaxed);
        slot.flags.store(flags | FLAG_GROUP_CAP, Relaxed);
        slot.updated_ms.store(now_ms(), Relaxed);
    }

    /// Sets or clears flag bits of slot `s` (e.g. [`FLAG_WAITING`]).
    pub fn set_flag(&self, s: RegSlotIndex, bit: u64, on: bool) {
        let f = &self.layout().slots[s.0].flags;
        if on {
            f.fetch_or(bit, Relaxed);
        } else {
            f.fetch_and(!bit, Relaxed);
        }
    }

    /// Gives slot `s` back (at exit), if `me` still holds it.
    pub fn unregister(&self, s: RegSlotIndex, me: ProcessKey) {
        let _ = self.layout().slots[s.0]
            .key
            .compare_exchange(me.word(), 0, SeqCst, Relaxed);
    }

    /// The live registered processes, in slot order.
    pub fn snapshot(&self) -> Vec<Registered> {
        self.snapshot_with(&|k| k.alive(true))
    }

    /// [`Registry::snapshot`] with a custom liveness test.
    pub fn snapshot_with(&self, alive: &dyn Fn(ProcessKey) -> bool) -> Vec<Registered> {
        let mut out = Vec::new();
        for (i, s) in self.layout().slots.iter().enumerate() {
            let k = s.key.load(SeqCst);
            if k == 0 || k & CLAIMING != 0 {
                continue;
            }
            let Some(key) = ProcessKey::from_word(k) else {
                continue;
            };
            if !alive(key) {
                continue;
            }
            let flags = s.flags.load(Relaxed);
            let group_cap_known = flags & FLAG_GROUP_CAP != 0;
            let mut devices = Vec::new();
            for d in &s.devices {
                let o = d.ordinal.load(Relaxed);
                if o == 0 {
                    continue;
                }
                let w = [d.uuid[0].load(Relaxed), d.uuid[1].load(Relaxed)];
                let cap = d.cap.load(Relaxed);
                let group_cap = d.group_cap.load(Relaxed);
                devices.push(DeviceRecord {
                    ordinal: (o - 1).min(u64::from(u32::MAX)) as u32,
                    uuid: (w != [0, 0]).then(|| DeviceId::from_words(w)),
                    cap: (cap != 0).then(|| cap - 1),
                    group_cap: (group_cap_known && group_cap != 0).then(|| group_cap - 1),
                    used: d.used.load(Relaxed),
                    peak: d.peak.load(Relaxed),
                    pool_reserved: d.pool_reserved.load(Relaxed),
                });
            }
            let rec = Registered {
                slot: i,
                pid: key.pid(),
                identity: Identity {
                    uid: s.uid.load(Relaxed) as u32,
                    start_ticks: s.start_ticks.load(Relaxed),
                    cmd: load_text(&s.cmd),
                    group: load_text(&s.group),
                    container: Container {
                        runtime: Runtime::from_word(s.runtime.load(Relaxed)),
                        id: load_text(&s.container),
                        pod_uid: load_text(&s.pod),
                    },
                },
                flags,
                refusals: s.refusals.load(Relaxed),
                ooms: s.ooms.load(Relaxed),
                updated_ms: s.updated_ms.load(Relaxed),
                devices,
            };
            // Taken over while we read it: its numbers may be another process's.
            if s.key.load(SeqCst) == k {
                out.push(rec);
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
