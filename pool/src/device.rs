//! The `Device` trait: everything a policy may ask of a GPU, with no FFI.
//!
//! Two faces:
//! - the virtual-memory face (`reserve`/`unreserve` address ranges, `create`/`release`
//!   physical handles of a run of granularity pages, `map`/`unmap`, `set_access`), used by
//!   `stitch`. A handle is mapped whole (CUDA's `cuMemMap` takes no offset into a handle
//!   but 0) and released whole;
//! - the plain face (`malloc`/`free`, like `cuMemAlloc`/`cuMemFree`: the driver's own
//!   rounding and sub-page packing, and `free` implies a device synchronization as `cudaFree`
//!   does), used by `caching` and `direct`.
//!
//! Plus ordering: `synchronize` (device-wide), events on streams, and the capture state.
//! Implementations: [`crate::AccountingDevice`] (no memory; counts and checks) here, and the
//! CUDA backend inside the interposer.

/// A CUDA stream handle as the process sees it (0 = legacy default stream).
pub type Stream = u64;
/// An opaque physical-memory handle (a run of one or more granularity pages).
pub type Handle = u64;
/// An opaque event handle.
pub type EventId = u64;

/// Why a device call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// The device has no memory left (`CUDA_ERROR_OUT_OF_MEMORY`).
    OutOfMemory,
    /// vramshim's cap refused the growth (looks like out-of-memory to the process).
    CapExceeded,
    /// The operation is not legal now (e.g. a synchronization during stream capture).
    NotPermitted,
    /// The operation is not supported by this device (e.g. no virtual-memory API).
    Unsupported,
    /// Any other driver error, with the driver's code.
    Driver(i32),
}

impl DeviceError {
    /// True for the refusals that mean "no memory" (device or cap).
    pub fn is_oom(self) -> bool {
        matches!(self, DeviceError::OutOfMemory | DeviceError::CapExceeded)
    }
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceError::OutOfMemory => write!(f, "device out of memory"),
            DeviceError::CapExceeded => write!(f, "cap exceeded"),
            DeviceError::NotPermitted => write!(f, "operation not permitted now"),
            DeviceError::Unsupported => write!(f, "not supported"),
            DeviceError::Driver(c) => write!(f, "driver error {c}"),
        }
    }
}

/// Device calls by kind. "Driver calls" (the memory-management calls a pool wants to avoid
/// in steady state) are [`CallCounts::driver_calls`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    pub reserve: u64,
    pub unreserve: u64,
    pub create: u64,
    pub release: u64,
    pub map: u64,
    pub unmap: u64,
    pub set_access: u64,
    pub malloc: u64,
    pub free: u64,
    /// Explicit device synchronizations requested by the policy.
    pub synchronize: u64,
    /// `free` calls: each implies a device synchronization (as `cudaFree`).
    pub implicit_syncs: u64,
    pub event_record: u64,
    pub event_query: u64,
    pub stream_wait: u64,
    pub event_destroy: u64,
}

impl CallCounts {
    /// Memory-management driver calls: reserve, unreserve, create, release, map, unmap,
    /// set_access, malloc, free.
    pub fn driver_calls(&self) -> u64 {
        self.reserve
            + self.unreserve
            + self.create
            + self.release
            + self.map
            + self.unmap
            + self.set_access
            + self.malloc
            + self.free
    }

    /// Device synchronizations, explicit and implied by `free`.
    pub fn syncs(&self) -> u64 {
        self.synchronize + self.implicit_syncs
    }

    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &CallCounts) -> CallCounts {
        CallCounts {
            reserve: self.reserve - earlier.reserve,
            unreserve: self.unreserve - earlier.unreserve,
            create: self.create - earlier.create,
            release: self.release - earlier.release,
            map: self.map - earlier.map,
            unmap: self.unmap - earlier.unmap,
            set_access: self.set_access - earlier.set_access,
            malloc: self.malloc - earlier.malloc,
            free: self.free - earlier.free,
            synchronize: self.synchronize - earlier.synchronize,
            implicit_syncs: self.implicit_syncs - earlier.implicit_syncs,
            event_record: self.event_record - earlier.event_record,
            event_query: self.event_query - earlier.event_query,
            stream_wait: self.stream_wait - earlier.stream_wait,
            event_destroy: self.event_destroy - earlier.event_destroy,
        }
    }
}

/// What a policy may ask of a GPU. Object safe: policies take `&mut dyn Device`.
pub trait Device {
    /// Physical granularity in bytes (2 MiB on current GPUs). Handles are whole pages.
    fn granularity(&self) -> u64;

    // ---- virtual-memory face ----
    /// Reserve `size` bytes (a multiple of the granularity) of address space, page aligned.
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// Free an address range returned by `reserve` (must be unmapped).
    fn unreserve(&mut self, va: u64, size: u64) -> Result<(), DeviceError>;
    /// Create one physical handle of `pages` (>= 1) granularity pages, charged to the device
    /// and cap as a whole: one driver call whatever its length.
    fn create(&mut self, pages: u64) -> Result<Handle, DeviceError>;
    /// Release a handle of `pages` pages as created (must be unmapped everywhere).
    fn release(&mut self, handle: Handle, pages: u64) -> Result<(), DeviceError>;
    /// Map all of `handle` (`pages` pages, as created) at the page-aligned address `va`
    /// inside a reservation: one driver call.
    fn map(&mut self, va: u64, handle: Handle, pages: u64) -> Result<(), DeviceError>;
    /// Unmap every page in `[va, va + size)`, which holds whole handle mappings only. Does
    /// not wait for the device.
    fn unmap(&mut self, va: u64, size: u64) -> Result<(), DeviceError>;
    /// Make `[va, va + size)` readable and writable by the device (and its peers).
    fn set_access(&mut self, va: u64, size: u64) -> Result<(), DeviceError>;

    // ---- plain face ----
    /// `cuMemAlloc`: a contiguous allocation with the driver's rounding.
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// `cuMemFree`: implies a device synchronization.
    fn free(&mut self, ptr: u64) -> Result<(), DeviceError>;

    // ---- ordering ----
    /// Wait for all work on the device. Illegal during stream capture.
    fn synchronize(&mut self) -> Result<(), DeviceError>;
    /// True while some stream of the process is being captured into a graph.
    fn is_capturing(&self) -> bool;
    /// Record an event on `stream` at its current position.
    fn record_event(&mut self, stream: Stream) -> Result<EventId, DeviceError>;
    /// Non-blocking: has the stream reached the event?
    fn event_done(&mut self, event: EventId) -> bool;
    /// Make `stream` wait for `event` (no host synchronization).
    fn stream_wait_event(&mut self, stream: Stream, event: EventId) -> Result<(), DeviceError>;
    /// Destroy an event returned by `record_event`.
    fn destroy_event(&mut self, event: EventId);

    /// Bytes of physical memory `create` may still take (the device's free memory, within
    /// the cap), if known. `None` (the default): unknown, and a pool never takes the device
    /// for nearly full (see `stitch`'s pressure rule).
    fn room(&self) -> Option<u64> {
        None
    }
}
