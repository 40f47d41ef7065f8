//! `cuGetExportTable`: the private function tables NVIDIA's own user-mode libraries (the real
//! `libcudart`, shared and static, and the static copies inside cuBLAS/cuBLASLt) ask the driver
//! for by UUID. Each table is an array of pointers; where the first slot is a size it holds the
//! table's size in bytes. What each slot must do, and how that was established, is in
//! docs/cuda-sim.md ("Private export tables"). A UUID not listed answers CUDA_ERROR_NOT_FOUND,
//! which the runtime tolerates for the tables it can live without.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use crate::abi::*;
use crate::config::{CONFIG, ExportFault};
use crate::{ctx, guard, integrity, state};

/// A table of `N` slots with a stable address (the integrity check hashes table addresses).
#[repr(C)]
pub struct Table<const N: usize>(pub [*const c_void; N]);

// SAFETY: immutable arrays of function pointers and integers, never written.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    const SIZE: *const c_void = (N * std::mem::size_of::<usize>()) as *const c_void;
    fn start(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// A slot whose behaviour is not known: rather than a NULL the caller would jump to, a
/// function that answers CUDA_ERROR_NOT_SUPPORTED and, with VRAMSIM_DEBUG=1, names itself
/// (`vramsim: exportTable.<table>.slot<N> (not served) -> 801`), so a library that needs it
/// shows where to look next.
macro_rules! unserved {
    ($table:literal, $slot:literal) => {{
        unsafe extern "C" fn unserved() -> CUresult {
            guard(
                concat!("exportTable.", $table, ".slot", $slot, " (not served)"),
                || Err(CUDA_ERROR_NOT_SUPPORTED),
            )
        }
        unserved as *const c_void
    }};
}

/// `6bd5fb6c-5bf4-e74a-8987-d93912fd9df9`: the runtime interface. Without it `cudart` cannot
/// register its fat binaries nor find a device's primary context.
pub static RUNTIME: Table<13> = Table([
    Table::<13>::SIZE,
    rt_load_fatbin as *const c_void,
    rt_primary_context as *const c_void,
    unserved!("runtime", 3),
    unserved!("runtime", 4),
    unserved!("runtime", 5),
    rt_load_fatbin_ext as *const c_void,
    rt_noop as *const c_void,
    rt_load_fatbin_header as *const c_void,
    unserved!("runtime", 9),
    unserved!("runtime", 10),
    unserved!("runtime", 11),
    rt_load_compilers as *const c_void,
]);
const RUNTIME_ID: [u8; 16] = uuid(0x6bd5fb6c_5bf4_e74a_8987_d93912fd9df9);

/// `a094798c-2e74-2e74-93f2-0800200c0a66`: tool callback hooks. The runtime reads two buffers
/// a profiler would fill in; zeroed buffers say "no tool attached". cuBLASLt calls slots 1 and
/// 4 around its work (with a callback id such as 0x1d4 and a record): with no tool subscribed
/// there is nothing to notify, so they do nothing.
pub static TOOL_HOOKS: Table<7> = Table([
    Table::<7>::SIZE,
    hooks_notify as *const c_void,
    hooks_buffer_a as *const c_void,
    unserved!("toolHooks", 3),
    hooks_notify as *const c_void,
    unserved!("toolHooks", 5),
    hooks_buffer_b as *const c_void,
]);
const TOOL_HOOKS_ID: [u8; 16] = uuid(0xa094798c_2e74_2e74_93f2_0800200c0a66);

/// `42d85a81-23f6-cb47-8298-f6e78a3aecdc`: tools thread-local state; slot 2 reports the
/// calling thread's current context.
pub static TOOLS_TLS: Table<4> = Table([
    Table::<4>::SIZE,
    unserved!("toolsTls", 1),
    tls_current_context as *const c_void,
    unserved!("toolsTls", 3),
]);
const TOOLS_TLS_ID: [u8; 16] = uuid(0x42d85a81_23f6_cb47_8298_f6e78a3aecdc);

/// `c693336e-1121-df11-a8c3-68f355d89593`: context-local storage (no size slot): put, delete,
/// get of a value per (context, key), with a destructor run when the context goes away.
pub static CONTEXT_STORAGE: Table<4> = Table([
    cls_put as *const c_void,
    cls_delete as *const c_void,
    cls_get as *const c_void,
    unserved!("contextStorage", 3),
]);
const CONTEXT_STORAGE_ID: [u8; 16] = uuid(0xc693336e_1121_df11_a8c3_68f355d89593);

/// `263e8860-7cd2-6143-92f6-bbd5006dfa7e`: context checks; both report "nothing special".
pub static CONTEXT_CHECKS: Table<4> = Table([
    Table::<4>::SIZE,
    unserved!("contextChecks", 1),
    checks_context as *const c_void,
    checks_flag as *const c_void,
]);
const CONTEXT_CHECKS_ID: [u8; 16] = uuid(0x263e8860_7cd2_6143_92f6_bbd5006dfa7e);

/// `d4082055-bde6-704b-8d34-ba123c66e1f2`: the integrity check (see `integrity`).
pub static INTEGRITY: Table<3> = Table([
    Table::<3>::SIZE,
    integrity_check as *const c_void,
    unserved!("integrity", 2),
]);
const INTEGRITY_ID: [u8; 16] = uuid(0xd4082055_bde6_704b_8d34_ba123c66e1f2);

/// `21318c60-9714-3248-8ca6-41ff7324c8f2`: context identity, asked for by cuBLASLt. Slot 4
/// (ctx, u64 out*) gives the context's unique id, which cuBLASLt uses as the key of its
/// per-context state (its algorithm heuristics cache among it): it takes the current context
/// from the tools thread-local table (`42d85a81`, slot 2), asks this slot for its id, and
/// looks the id up in its own map. The size of the table is not known: slots 1 to 3 and 5 to
/// 7 name themselves if called.
pub static CONTEXT_IDS: Table<64> = Table([
    Table::<64>::SIZE,
    unserved!("contextIds", 1),
    unserved!("contextIds", 2),
    unserved!("contextIds", 3),
    ids_context_id as *const c_void,
    unserved!("contextIds", 5),
    unserved!("contextIds", 6),
    unserved!("contextIds", 7),
    unserved!("contextIds", 8),
    unserved!("contextIds", 9),
    unserved!("contextIds", 10),
    unserved!("contextIds", 11),
    unserved!("contextIds", 12),
    unserved!("contextIds", 13),
    unserved!("contextIds", 14),
    unserved!("contextIds", 15),
    unserved!("contextIds", 16),
    unserved!("contextIds", 17),
    unserved!("contextIds", 18),
    unserved!("contextIds", 19),
    unserved!("contextIds", 20),
    unserved!("contextIds", 21),
    unserved!("contextIds", 22),
    unserved!("contextIds", 23),
    unserved!("contextIds", 24),
    unserved!("contextIds", 25),
    unserved!("contextIds", 26),
    unserved!("contextIds", 27),
    unserved!("contextIds", 28),
    unserved!("contextIds", 29),
    unserved!("contextIds", 30),
    unserved!("contextIds", 31),
    unserved!("contextIds", 32),
    unserved!("contextIds", 33),
    unserved!("contextIds", 34),
    unserved!("contextIds", 35),
    unserved!("contextIds", 36),
    unserved!("contextIds", 37),
    unserved!("contextIds", 38),
    ids_stream_id as *const c_void,
    unserved!("contextIds", 40),
    unserved!("contextIds", 41),
    unserved!("contextIds", 42),
    unserved!("contextIds", 43),
    unserved!("contextIds", 44),
    unserved!("contextIds", 45),
    unserved!("contextIds", 46),
    unserved!("contextIds", 47),
    unserved!("contextIds", 48),
    unserved!("contextIds", 49),
    unserved!("contextIds", 50),
    ids_stream as *const c_void,
    unserved!("contextIds", 52),
    unserved!("contextIds", 53),
    unserved!("contextIds", 54),
    unserved!("contextIds", 55),
    unserved!("contextIds", 56),
    unserved!("contextIds", 57),
    unserved!("contextIds", 58),
    unserved!("contextIds", 59),
    unserved!("contextIds", 60),
    unserved!("contextIds", 61),
    unserved!("contextIds", 62),
    unserved!("contextIds", 63),
]);
const CONTEXT_IDS_ID: [u8; 16] = uuid(0x21318c60_9714_3248_8ca6_41ff7324c8f2);

/// A UUID written as one number, in the byte order it is printed (and compared) in.
const fn uuid(v: u128) -> [u8; 16] {
    v.to_be_bytes()
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, bytes in order.
pub fn format_uuid(id: &[u8; 16]) -> String {
    let h: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The table for `id`, if cuda-sim serves it.
pub fn lookup(id: &[u8; 16]) -> Option<*const c_void> {
    if CONFIG.export_fault == ExportFault::Refuse {
        return None;
    }
    let tables: [(&[u8; 16], *const c_void); 7] = [
        (&CONTEXT_IDS_ID, CONTEXT_IDS.start()),
        (&RUNTIME_ID, RUNTIME.start()),
        (&TOOL_HOOKS_ID, TOOL_HOOKS.start()),
        (&TOOLS_TLS_ID, TOOLS_TLS.start()),
        (&CONTEXT_STORAGE_ID, CONTEXT_STORAGE.start()),
        (&CONTEXT_CHECKS_ID, CONTEXT_CHECKS.start()),
        (&INTEGRITY_ID, INTEGRITY.start()),
    ];
    tables.iter().find(|(k, _)| *k == id).map(|&(_, t)| t)
}

// ---- runtime interface ----

/// A module for the runtime's fat binary (kernels are not executed; globals are read from it).
///
/// # Safety
/// `fatbin` is NULL or a fat binary or fat-binary wrapper.
unsafe fn load_fatbin(module: *mut CUmodule, fatbin: *const c_void) -> Res {
    if module.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = ctx::current_device()?;
    // SAFETY: per this function's contract.
    let symbols = unsafe { crate::module::read_image(fatbin.cast()) };
    // SAFETY: C out-pointer, checked above.
    unsafe { put(module, crate::module::load(Some(dev), symbols)) }
}

unsafe extern "C" fn rt_load_fatbin(module: *mut CUmodule, fatbin: *const c_void) -> CUresult {
    guard("exportTable.runtime.loadFatbin", || {
        // SAFETY: the fat binary (or its wrapper) the runtime registers.
        unsafe { load_fatbin(module, fatbin) }
    })
}

unsafe extern "C" fn rt_load_fatbin_ext(
    module: *mut CUmodule,
    fatbin: *const c_void,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: c_uint,
) -> CUresult {
    guard("exportTable.runtime.loadFatbinExt", || {
        // SAFETY: the fat binary (or its wrapper) the runtime registers.
        unsafe { load_fatbin(module, fatbin) }
    })
}

unsafe extern "C" fn rt_load_fatbin_header(
    fatbin: *const c_void,
    module: *mut CUmodule,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: c_uint,
) -> CUresult {
    guard("exportTable.runtime.loadFatbinHeader", || {
        // SAFETY: the fat binary (or its wrapper) the runtime registers.
        unsafe { load_fatbin(module, fatbin) }
    })
}

/// The device's primary context, retained on the runtime's behalf (as the runtime's own
/// `cuDevicePrimaryCtxRetain` would).
unsafe extern "C" fn rt_primary_context(out: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard("exportTable.runtime.primaryContext", || {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = ctx::primary_retain(dev)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(out, c) }
    })
}

unsafe extern "C" fn rt_noop(_arg: usize) {}

/// Loading the PTX/NVVM compilers: nothing to load here.
unsafe extern "C" fn rt_load_compilers() -> CUresult {
    CUDA_SUCCESS
}

// ---- tool hooks ----

/// Zeroed buffers owned by the driver for the life of the process (tools write nothing here).
struct HookBuffer<const N: usize>(std::cell::UnsafeCell<[u8; N]>);
// SAFETY: handed out as raw memory to the runtime; the driver itself never reads or writes it.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}

// Larger than the sizes reported: the runtime reads flags beyond the reported size (cuBLASLt's
// copy reads offset 0x524 of the first buffer to decide whether a tool is subscribed), and must
// read zeros there.
static HOOKS_A: HookBuffer<8192> = HookBuffer(std::cell::UnsafeCell::new([0; 8192]));
static HOOKS_B: HookBuffer<8192> = HookBuffer(std::cell::UnsafeCell::new([0; 8192]));

unsafe extern "C" fn hooks_buffer_a(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: C out-pointers (NULL ones skipped).
    unsafe { give_buffer(ptr, size, HOOKS_A.0.get().cast(), 1024) }
}

unsafe extern "C" fn hooks_buffer_b(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: C out-pointers (NULL ones skipped).
    unsafe { give_buffer(ptr, size, HOOKS_B.0.get().cast(), 56) }
}

/// # Safety
/// `ptr` and `size` are NULL or valid for writes.
unsafe fn give_buffer(ptr: *mut *mut c_void, size: *mut usize, buf: *mut c_void, len: usize) {
    if !ptr.is_null() {
        // SAFETY: non-null C out-pointer.
        unsafe { ptr.write_unaligned(buf) };
    }
    if !size.is_null() {
        // SAFETY: non-null C out-pointer.
        unsafe { size.write_unaligned(len) };
    }
}

/// Tool notification with no tool subscribed: nothing to do.
unsafe extern "C" fn hooks_notify(_id: usize, _record: *mut c_void) -> CUresult {
    CUDA_SUCCESS
}

// ---- tools thread-local ----

unsafe extern "C" fn tls_current_context(out: *mut CUcontext) -> CUresult {
    guard("exportTable.toolsTls.currentContext", || {
        // SAFETY: C out-pointer.
        unsafe { put(out, ctx::get_current()) }
    })
}

// ---- context-local storage ----

type ClsDestructor = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

struct ClsEntry {
    ctx: usize,
    key: usize,
    value: usize,
    dtor: ClsDestructor,
}

static CLS: Mutex<Vec<ClsEntry>> = Mutex::new(Vec::new());

fn cls() -> std::sync::MutexGuard<'static, Vec<ClsEntry>> {
    CLS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The context a storage call names: NULL is the current one; a dead one is an error.
fn cls_context(c: CUcontext) -> Result<usize, CUresult> {
    let c = if c.is_null() { ctx::get_current() } else { c };
    ctx::device_of(c)?;
    Ok(c as usize)
}

unsafe extern "C" fn cls_put(
    c: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: ClsDestructor,
) -> CUresult {
    guard("exportTable.contextStorage.put", || {
        let c = cls_context(c)?;
        let mut t = cls();
        t.retain(|e| !(e.ctx == c && e.key == key as usize));
        t.push(ClsEntry {
            ctx: c,
            key: key as usize,
            value: value as usize,
            dtor,
        });
        Ok(())
    })
}

unsafe extern "C" fn cls_delete(c: CUcontext, key: *mut c_void) -> CUresult {
    guard("exportTable.contextStorage.delete", || {
        let c = cls_context(c)?;
        cls().retain(|e| !(e.ctx == c && e.key == key as usize));
        Ok(())
    })
}

unsafe extern "C" fn cls_get(out: *mut *mut c_void, c: CUcontext, key: *mut c_void) -> CUresult {
    guard("exportTable.contextStorage.get", || {
        let c = cls_context(c)?;
        let v = cls()
            .iter()
            .find(|e| e.ctx == c && e.key == key as usize)
            .map(|e| e.value)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, v as *mut c_void) }
    })
}

/// Runs (and forgets) the destructors of the values stored on context `c`, which just went
/// away. Called with no driver lock held: a destructor may call back into the driver.
pub fn context_gone(ctx: usize) {
    let c = ctx as CUcontext;
    let gone: Vec<ClsEntry> = {
        let mut t = cls();
        let (gone, keep) = std::mem::take(&mut *t)
            .into_iter()
            .partition(|e| e.ctx == ctx);
        *t = keep;
        gone
    };
    for e in gone {
        if let Some(d) = e.dtor {
            // SAFETY: the destructor the owner registered for this value, called once with
            // the (context, key, value) it was stored under.
            unsafe { d(c, e.key as *mut c_void, e.value as *mut c_void) };
        }
    }
}

// ---- context ids ----

/// The id of context `c` (NULL: the current one), as `cuCtxGetId` gives it.
unsafe extern "C" fn ids_context_id(c: CUcontext, id: *mut u64) -> CUresult {
    guard("exportTable.contextIds.id", || {
        let c = if c.is_null() { ctx::get_current() } else { c };
        ctx::device_of(c)?;
        // SAFETY: C out-pointer.
        unsafe { put(id, c as u64) }
    })
}

/// The stream `s` names in context `c` (0: the legacy default stream, 2: the per-thread one,
/// else a created stream), checked; the handle is given back as is (what the id slot takes).
unsafe extern "C" fn ids_stream(c: CUcontext, s: CUstream, out: *mut CUstream) -> CUresult {
    guard("exportTable.contextIds.stream", || {
        let c = if c.is_null() { ctx::get_current() } else { c };
        ctx::device_of(c)?;
        crate::stream::resolve(s, false)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, s) }
    })
}

/// The id of stream `s` of context `c`, as `cuStreamGetId` gives it.
unsafe extern "C" fn ids_stream_id(c: CUcontext, s: CUstream, out: *mut u64) -> CUresult {
    guard("exportTable.contextIds.streamId", || {
        let c = if c.is_null() { ctx::get_current() } else { c };
        ctx::device_of(c)?;
        let st = crate::stream::resolve(s, false)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, st.handle as u64) }
    })
}

// ---- context checks ----

unsafe extern "C" fn checks_context(
    _c: CUcontext,
    result: *mut c_uint,
    _detail: *mut *const c_void,
) -> CUresult {
    guard("exportTable.contextChecks.context", || {
        // SAFETY: C out-pointer.
        unsafe { put(result, 0) }
    })
}

unsafe extern "C" fn checks_flag() -> c_uint {
    0
}

// ---- integrity check ----

unsafe extern "C" fn integrity_check(
    runtime_version: c_uint,
    unix_seconds: u64,
    out: *mut [u64; 2],
) -> CUresult {
    guard("exportTable.integrity.check", || {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let inputs = integrity_inputs(runtime_version, unix_seconds)?;
        let mut a = integrity::answer(&inputs);
        if CONFIG.export_fault == ExportFault::Integrity && runtime_version % 10 >= 2 {
            a[0] ^= 1;
        }
        if CONFIG.debug {
            eprintln!("vramsim: integrity check for runtime version {runtime_version}");
        }
        // SAFETY: C out-pointer, checked above.
        unsafe { put(out, a) }
    })
}

/// The integrity answer's inputs for the calling thread, as the runtime computes them.
pub fn integrity_inputs(
    runtime_version: u32,
    unix_seconds: u64,
) -> Result<integrity::Inputs, CUresult> {
    let n = state::device_count()?;
    let mut devices = Vec::with_capacity(n as usize);
    for dev in 0..n {
        let phys = state::physical(dev)?;
        let attr = |a: c_int| crate::exports::device::attribute(a, phys as i32).unwrap_or(0);
        devices.push(integrity::Device {
            uuid: crate::exports::device::uuid(phys).bytes,
            pci_domain: attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            pci_bus: attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            pci_device: attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
        });
    }
    Ok(integrity::Inputs {
        driver_version: CONFIG.driver_version as u32,
        runtime_version,
        pid: std::process::id(),
        // SAFETY: pthread_self has no preconditions. The runtime hashes its low 32 bits.
        thread: unsafe { libc::pthread_self() } as u32,
        runtime_table: RUNTIME.start() as u64,
        integrity_table: INTEGRITY.start() as u64,
        function: INTEGRITY.0[1] as u64,
        unix_seconds,
        devices,
    })
}

const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
