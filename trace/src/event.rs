//! The vocabulary shared by the interposer (capture) and the analyzer (analysis).
//!
//! Numeric values of the enums are part of the on-disk format: never renumber, only append.

/// Which public entry point a request came through. `_ptsz` variants are the same `Api`
/// with `Flags::PER_THREAD_STREAM` set on the record.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Api {
    Unknown = 0,
    CudaMalloc = 1,
    CudaFree = 2,
    CudaMallocAsync = 3,
    CudaFreeAsync = 4,
    CudaMallocFromPoolAsync = 5,
    CudaMallocPitch = 6,
    CudaMalloc3D = 7,
    CudaMallocManaged = 8,
    CudaMallocHost = 9,
    CudaHostAlloc = 10,
    CudaFreeHost = 11,
    CudaMemGetInfo = 12,
    CudaDeviceReset = 13,
    CuMemAlloc = 20,
    CuMemFree = 21,
    CuMemAllocPitch = 22,
    CuMemAllocManaged = 23,
    CuMemAllocAsync = 24,
    CuMemFreeAsync = 25,
    CuMemAllocFromPoolAsync = 26,
    CuMemCreate = 27,
    CuMemRelease = 28,
    CuMemGetInfo = 29,
    CuDeviceTotalMem = 30,
    CuMemAllocHost = 31,
    CuMemHostAlloc = 32,
    CuMemFreeHost = 33,
    NvmlDeviceGetMemoryInfo = 40,
    NvmlDeviceGetMemoryInfoV2 = 41,
    CudaGetDeviceProperties = 42,
    /// Synthetic: a request replayed from an imported log (RMM CSV, memory_viz).
    Imported = 60,
}

impl Api {
    pub const ALL: &'static [Api] = &[
        Api::Unknown,
        Api::CudaMalloc,
        Api::CudaFree,
        Api::CudaMallocAsync,
        Api::CudaFreeAsync,
        Api::CudaMallocFromPoolAsync,
        Api::CudaMallocPitch,
        Api::CudaMalloc3D,
        Api::CudaMallocManaged,
        Api::CudaMallocHost,
        Api::CudaHostAlloc,
        Api::CudaFreeHost,
        Api::CudaMemGetInfo,
        Api::CudaDeviceReset,
        Api::CuMemAlloc,
        Api::CuMemFree,
        Api::CuMemAllocPitch,
        Api::CuMemAllocManaged,
        Api::CuMemAllocAsync,
        Api::CuMemFreeAsync,
        Api::CuMemAllocFromPoolAsync,
        Api::CuMemCreate,
        Api::CuMemRelease,
        Api::CuMemGetInfo,
        Api::CuDeviceTotalMem,
        Api::CuMemAllocHost,
        Api::CuMemHostAlloc,
        Api::CuMemFreeHost,
        Api::NvmlDeviceGetMemoryInfo,
        Api::NvmlDeviceGetMemoryInfoV2,
        Api::CudaGetDeviceProperties,
        Api::Imported,
    ];

    pub fn from_u16(v: u16) -> Option<Api> {
        // A table lookup: the trace decoder calls this for every record.
        const TABLE: [Option<Api>; 256] = {
            let mut t = [None; 256];
            let mut i = 0;
            while i < Api::ALL.len() {
                t[Api::ALL[i] as usize] = Some(Api::ALL[i]);
                i += 1;
            }
            t
        };
        TABLE.get(v as usize).copied().flatten()
    }

    /// The C name of the entry point (without `_v2`/`_ptsz` decoration).
    pub fn name(self) -> &'static str {
        match self {
            Api::Unknown => "unknown",
            Api::CudaMalloc => "cudaMalloc",
            Api::CudaFree => "cudaFree",
            Api::CudaMallocAsync => "cudaMallocAsync",
            Api::CudaFreeAsync => "cudaFreeAsync",
            Api::CudaMallocFromPoolAsync => "cudaMallocFromPoolAsync",
            Api::CudaMallocPitch => "cudaMallocPitch",
            Api::CudaMalloc3D => "cudaMalloc3D",
            Api::CudaMallocManaged => "cudaMallocManaged",
            Api::CudaMallocHost => "cudaMallocHost",
            Api::CudaHostAlloc => "cudaHostAlloc",
            Api::CudaFreeHost => "cudaFreeHost",
            Api::CudaMemGetInfo => "cudaMemGetInfo",
            Api::CudaDeviceReset => "cudaDeviceReset",
            Api::CuMemAlloc => "cuMemAlloc",
            Api::CuMemFree => "cuMemFree",
            Api::CuMemAllocPitch => "cuMemAllocPitch",
            Api::CuMemAllocManaged => "cuMemAllocManaged",
            Api::CuMemAllocAsync => "cuMemAllocAsync",
            Api::CuMemFreeAsync => "cuMemFreeAsync",
            Api::CuMemAllocFromPoolAsync => "cuMemAllocFromPoolAsync",
            Api::CuMemCreate => "cuMemCreate",
            Api::CuMemRelease => "cuMemRelease",
            Api::CuMemGetInfo => "cuMemGetInfo",
            Api::CuDeviceTotalMem => "cuDeviceTotalMem",
            Api::CuMemAllocHost => "cuMemAllocHost",
            Api::CuMemHostAlloc => "cuMemHostAlloc",
            Api::CuMemFreeHost => "cuMemFreeHost",
            Api::NvmlDeviceGetMemoryInfo => "nvmlDeviceGetMemoryInfo",
            Api::NvmlDeviceGetMemoryInfoV2 => "nvmlDeviceGetMemoryInfo_v2",
            Api::CudaGetDeviceProperties => "cudaGetDeviceProperties",
            Api::Imported => "imported",
        }
    }
}

/// What kind of memory a live allocation is. Host memory is traced but never charged to a device.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllocKind {
    Runtime = 0,
    Driver = 1,
    Async = 2,
    Managed = 3,
    Pitch = 4,
    VmmHandle = 5,
    Host = 6,
    /// Served by vramshim's pool (the process asked through one of the paths above).
    Pool = 7,
}

impl AllocKind {
    pub const ALL: &'static [AllocKind] = &[
        AllocKind::Runtime,
        AllocKind::Driver,
        AllocKind::Async,
        AllocKind::Managed,
        AllocKind::Pitch,
        AllocKind::VmmHandle,
        AllocKind::Host,
        AllocKind::Pool,
    ];
    pub fn from_u8(v: u8) -> Option<AllocKind> {
        AllocKind::ALL.get(v as usize).copied()
    }
    pub fn name(self) -> &'static str {
        match self {
            AllocKind::Runtime => "runtime",
            AllocKind::Driver => "driver",
            AllocKind::Async => "async",
            AllocKind::Managed => "managed",
            AllocKind::Pitch => "pitch",
            AllocKind::VmmHandle => "vmm-handle",
            AllocKind::Host => "host",
            AllocKind::Pool => "pool",
        }
    }
    /// Whether this kind is charged against a device's memory (host memory is not).
    pub fn is_device(self) -> bool {
        !matches!(self, AllocKind::Host)
    }
}

/// Bit flags on alloc/free records.
pub mod flags {
    /// The `_ptsz` (per-thread default stream) variant was called.
    pub const PER_THREAD_STREAM: u8 = 1;
    /// The request was refused by vramshim's cap (not by the device).
    pub const CAP_REFUSED: u8 = 2;
    /// The request was served by vramshim's pool.
    pub const POOLED: u8 = 4;
    /// The call was made during stream capture.
    pub const CAPTURING: u8 = 8;
    /// The request waited for members of its group to free (`VRAMSHIM_ON_CAP=wait`); its
    /// latency includes the wait, its result says whether it was served in the end.
    pub const WAITED_ON_CAP: u8 = 16;
}

/// One allocation or free, as the process saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemOp {
    /// Monotonic nanoseconds (CLOCK_MONOTONIC), anchored by the header.
    pub t_ns: u64,
    /// Kernel thread id of the caller.
    pub tid: u32,
    pub api: Api,
    pub kind: AllocKind,
    pub flags: u8,
    /// Device ordinal; -1 for host memory or when unknown.
    pub device: i32,
    /// Stream handle as an integer (0 = legacy default stream).
    pub stream: u64,
    /// Device pointer (or VMM handle for `VmmHandle`); 0 when the call failed.
    pub addr: u64,
    /// Requested bytes for allocs; the live size for frees (0 when the pointer was unknown).
    pub size: u64,
    /// Raw CUDA / CUresult / nvmlReturn_t code the process saw.
    pub result: i32,
    /// Time spent inside the call, nanoseconds (saturating).
    pub latency_ns: u32,
    /// Deduplicated call-stack id (0 = none recorded).
    pub stack: u32,
}

/// Why a synchronization happened.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncKind {
    /// The process synchronized the device itself (cudaDeviceSynchronize, ctx sync).
    ProcessDevice = 0,
    /// The process synchronized a stream.
    ProcessStream = 1,
    /// The process synchronized an event.
    ProcessEvent = 2,
    /// vramshim's pool synchronized to release pending frees.
    PoolDevice = 3,
    /// vramshim's pool waited on an event (cross-stream reuse).
    PoolEvent = 4,
}

impl SyncKind {
    pub fn from_u8(v: u8) -> Option<SyncKind> {
        Some(match v {
            0 => SyncKind::ProcessDevice,
            1 => SyncKind::ProcessStream,
            2 => SyncKind::ProcessEvent,
            3 => SyncKind::PoolDevice,
            4 => SyncKind::PoolEvent,
            _ => return None,
        })
    }
}

/// Every record a trace body can hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Alloc(MemOp),
    Free(MemOp),
    /// vramshim's cap refused a request (the matching `Alloc` carries the OOM result too).
    CapRefusal {
        t_ns: u64,
        tid: u32,
        device: i32,
        api: Api,
        size: u64,
        in_use: u64,
        cap: u64,
    },
    /// The pool gave cached physical memory back to the driver.
    PoolTrim {
        t_ns: u64,
        device: i32,
        bytes: u64,
        reason: u8,
    },
    Sync {
        t_ns: u64,
        tid: u32,
        device: i32,
        kind: SyncKind,
        stream: u64,
        latency_ns: u32,
    },
    /// A memory-information query and what was answered.
    MemInfo {
        t_ns: u64,
        tid: u32,
        api: Api,
        device: i32,
        free: u64,
        total: u64,
        result: i32,
    },
    ThreadStart {
        t_ns: u64,
        tid: u32,
    },
    ThreadExit {
        t_ns: u64,
        tid: u32,
    },
    /// This process forked; the child writes its own file.
    Fork {
        t_ns: u64,
        child_pid: u32,
    },
    /// A loaded module (for offline symbolization).
    Module {
        base: u64,
        size: u64,
        file_offset: u64,
        path: String,
    },
    /// A deduplicated call stack: return addresses, innermost first.
    Stack {
        id: u32,
        frames: Vec<u64>,
    },
    /// Periodic counters per device, so a reader can seek and plot without a full replay.
    Counter {
        t_ns: u64,
        device: i32,
        live_bytes: u64,
        reserved_bytes: u64,
        cap: u64,
    },
    /// vramshim's pool on `device`: what it holds and why (periodic when it changes, and at
    /// exit). `budget` 0: no budget (the pool caches until the device or the cap refuses);
    /// `releases` counts pages given back.
    PoolStats {
        t_ns: u64,
        device: i32,
        reserved: u64,
        live: u64,
        cached: u64,
        pending: u64,
        budget: u64,
        releases: u64,
    },
    /// The process destroyed stream `stream` (`cudaStreamDestroy`, `cuStreamDestroy[_v2]`;
    /// `tid` the caller, `device` the calling thread's current device, -1 unknown), before the
    /// real destroy: the destroyed stream's work may still run, and a stream created later may
    /// get the same handle value. A replay retires the stream there
    /// (`vramshim_pool::replay::Event::StreamRetired`), as the live pool does.
    StreamDestroy {
        t_ns: u64,
        tid: u32,
        device: i32,
        stream: u64,
    },
    /// Events the writer could not keep up with; counted, never silent.
    Lost {
        t_ns: u64,
        count: u64,
    },
    /// A CUDA call that is not an allocation failed in a way that explains what followed:
    /// the driver's start-up (`cuInit`, a context's creation). `name` is the entry point,
    /// `result` the raw code, `device` the ordinal concerned (-1: none).
    CallFailed {
        t_ns: u64,
        tid: u32,
        device: i32,
        name: String,
        result: i32,
    },
    /// A device learned after the header was written (the tracer starts before CUDA is
    /// initialised; devices are described here once they are known). Same meaning as
    /// `Header::devices`.
    Device(DeviceInfo),
    /// An event of PyTorch's caching allocator (a tensor's block carved out of, or given back
    /// to, one of its segments), seen through the allocator's own trace tracker.
    Torch(TorchOp),
    /// A Python code object named once (`PyStack` frames refer to its `id`).
    PyCode {
        id: u32,
        file: String,
        function: String,
        first_line: u32,
    },
    /// A deduplicated Python stack: frames innermost first.
    PyStack {
        id: u32,
        frames: Vec<PyFrame>,
    },
}

/// What PyTorch's caching allocator did (its `TraceEntry::Action` numbers).
pub mod torch_action {
    pub const ALLOC: u8 = 0;
    pub const FREE_REQUESTED: u8 = 1;
    pub const FREE_COMPLETED: u8 = 2;
    pub const SEGMENT_ALLOC: u8 = 3;
    pub const SEGMENT_FREE: u8 = 4;
    pub const SEGMENT_MAP: u8 = 5;
    pub const SEGMENT_UNMAP: u8 = 6;
    pub const OOM: u8 = 8;

    /// PyTorch's own name of an action.
    pub fn name(a: u8) -> &'static str {
        match a {
            ALLOC => "alloc",
            FREE_REQUESTED => "free_requested",
            FREE_COMPLETED => "free_completed",
            SEGMENT_ALLOC => "segment_alloc",
            SEGMENT_FREE => "segment_free",
            SEGMENT_MAP => "segment_map",
            SEGMENT_UNMAP => "segment_unmap",
            7 => "snapshot",
            OOM => "oom",
            _ => "other",
        }
    }
}

/// One event of PyTorch's caching allocator.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TorchOp {
    pub t_ns: u64,
    /// Kernel thread id of the thread the allocator ran on.
    pub tid: u32,
    /// [`torch_action`] number.
    pub action: u8,
    pub device: i32,
    /// The block's (or segment's) address; for `OOM`, the free bytes the device reported.
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// Base address of the segment the block lies in (0 when unknown).
    pub segment: u64,
    /// `PyStack` id of the Python stack PyTorch captured for the block (0: none).
    pub stack: u32,
}

/// One Python frame of a `PyStack`: a `PyCode` id and the line executing in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PyFrame {
    pub code: u32,
    pub line: u32,
}

impl Event {
    /// The record's time, when it has one.
    pub fn t_ns(&self) -> Option<u64> {
        match self {
            Event::Alloc(m) | Event::Free(m) => Some(m.t_ns),
            Event::CapRefusal { t_ns, .. }
            | Event::PoolTrim { t_ns, .. }
            | Event::Sync { t_ns, .. }
            | Event::MemInfo { t_ns, .. }
            | Event::ThreadStart { t_ns, .. }
            | Event::ThreadExit { t_ns, .. }
            | Event::Fork { t_ns, .. }
            | Event::Counter { t_ns, .. }
            | Event::PoolStats { t_ns, .. }
            | Event::StreamDestroy { t_ns, .. }
            | Event::Lost { t_ns, .. }
            | Event::CallFailed { t_ns, .. } => Some(*t_ns),
            Event::Torch(op) => Some(op.t_ns),
            Event::Module { .. }
            | Event::Stack { .. }
            | Event::Device(_)
            | Event::PyCode { .. }
            | Event::PyStack { .. } => None,
        }
    }
}

/// A device as the header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub index: i32,
    pub name: String,
    pub total_bytes: u64,
    /// The device's UUID (`cuDeviceGetUuid`; a MIG instance's own): which physical GPU an
    /// ordinal was, so the traces of several processes or ranks can be lined up. Carried by
    /// `Device` records (a trailing field, absent in older traces); header entries have none.
    pub uuid: Option<[u8; 16]>,
}

impl DeviceInfo {
    /// The UUID as NVIDIA's tools print it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
    pub fn uuid_text(&self) -> Option<String> {
        self.uuid.map(|u| format_uuid(&u))
    }
}

/// `GPU-` and the 16 bytes in the 8-4-4-4-12 hexadecimal form `nvidia-smi -L` prints.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Everything a trace says about the process before its first event.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Header {
    pub format_version: u32,
    pub pid: u32,
    pub ppid: u32,
    pub host: String,
    pub cmdline: Vec<String>,
    /// Wall-clock time at start, nanoseconds since the Unix epoch.
    pub start_wall_ns: u64,
    /// CLOCK_MONOTONIC at the same instant.
    pub start_mono_ns: u64,
    pub devices: Vec<DeviceInfo>,
    /// The configuration in force (`VRAMSHIM_*` name, value as given).
    pub config: Vec<(String, String)>,
}

/// CUDA's out-of-memory codes, per API family.
pub mod codes {
    pub const CUDA_SUCCESS: i32 = 0;
    /// `cudaErrorMemoryAllocation` (runtime) == `CUDA_ERROR_OUT_OF_MEMORY` (driver) == 2.
    pub const OUT_OF_MEMORY: i32 = 2;
    /// `NVML_ERROR_MEMORY`.
    pub const NVML_ERROR_MEMORY: i32 = 20;
}
