//! Modules, libraries and their functions/kernels. Kernels are not executed, so a module is
//! what the program can observe of one: its handle, its functions (any name resolves: the
//! kernels of a fat binary the driver cannot read are still launchable), per-function
//! attributes, and its globals, backed by real device memory of the size the cubin's symbol
//! table gives, initialized from the image, allocated on first lookup and freed with the
//! module. A library (`cuLibrary*`) is a module that belongs to no context (CUDA 12's
//! context-independent loading): it is loaded without one, and its globals are allocated on the
//! device of the context current when they are looked up, once per device; its kernels are its
//! functions.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::abi::*;
use crate::image::{self, Symbols};
use crate::mem::{self, Kind};

const MODULE_BASE: usize = 0x7c3d_0000_0000;
const FUNCTION_BASE: usize = 0x7c3e_0000_0000;
const STEP: usize = 0x100;

struct Module {
    /// The device of the context a module was loaded into; None for a library.
    dev: Option<i32>,
    alive: bool,
    symbols: Symbols,
    /// (device, name) -> (device address, size) of the globals allocated so far.
    globals: BTreeMap<(i32, String), (u64, u64)>,
}

pub struct Function {
    pub module: usize,
    pub name: String,
    /// Attributes set by cuFuncSetAttribute/cuKernelSetAttribute (attribute -> value).
    pub set: BTreeMap<i32, i32>,
}

struct Table {
    modules: Vec<Module>,
    functions: Vec<Function>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    modules: Vec::new(),
    functions: Vec::new(),
});

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn index(h: *mut c_void, base: usize) -> Option<usize> {
    let v = h as usize;
    if v <= base || !(v - base).is_multiple_of(STEP) || v - base > STEP << 32 {
        return None;
    }
    Some((v - base) / STEP - 1)
}

fn handle(i: usize, base: usize) -> *mut c_void {
    (base + (i + 1) * STEP) as *mut c_void
}

/// Registers a module of `dev` (None: a library, of no context) with what was read from its
/// image.
pub fn load(dev: Option<i32>, symbols: Symbols) -> CUmodule {
    let mut t = table();
    t.modules.push(Module {
        dev,
        alive: true,
        symbols,
        globals: BTreeMap::new(),
    });
    handle(t.modules.len() - 1, MODULE_BASE)
}

fn live(t: &Table, m: CUmodule) -> Result<usize, CUresult> {
    index(m, MODULE_BASE)
        .filter(|&i| t.modules.get(i).is_some_and(|m| m.alive))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Unloads a module: its globals' memory goes back to the device.
pub fn unload(m: CUmodule) -> Res {
    let mut t = table();
    let i = live(&t, m)?;
    let module = &mut t.modules[i];
    module.alive = false;
    for (_, (ptr, _)) in std::mem::take(&mut module.globals) {
        let _ = mem::free(ptr, |k| k == Kind::Global);
    }
    module.symbols = Symbols::default();
    Ok(())
}

/// The function `name` of module `m` (the same handle for the same name).
pub fn function(m: CUmodule, name: &str) -> Result<CUfunction, CUresult> {
    let mut t = table();
    let module = live(&t, m)?;
    if let Some(i) = t
        .functions
        .iter()
        .position(|f| f.module == module && f.name == name)
    {
        return Ok(handle(i, FUNCTION_BASE));
    }
    t.functions.push(Function {
        module,
        name: name.to_string(),
        set: BTreeMap::new(),
    });
    Ok(handle(t.functions.len() - 1, FUNCTION_BASE))
}

fn function_index(t: &Table, f: CUfunction) -> Result<usize, CUresult> {
    let i = index(f, FUNCTION_BASE).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let func = t.functions.get(i).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if !t.modules[func.module].alive {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    Ok(i)
}

/// The module a function belongs to.
pub fn module_of(f: CUfunction) -> Result<CUmodule, CUresult> {
    let t = table();
    let i = function_index(&t, f)?;
    Ok(handle(t.functions[i].module, MODULE_BASE))
}

/// The function's name.
pub fn name_of(f: CUfunction) -> Result<String, CUresult> {
    let t = table();
    let i = function_index(&t, f)?;
    Ok(t.functions[i].name.clone())
}

/// Kernels a module's cubins name (for cuLibraryEnumerateKernels / cuModuleEnumerateFunctions).
pub fn kernels(m: CUmodule) -> Result<Vec<CUfunction>, CUresult> {
    let names = {
        let t = table();
        let i = live(&t, m)?;
        t.modules[i].symbols.kernels.clone()
    };
    names.iter().map(|n| function(m, n)).collect()
}

/// Checks a function handle (a launch of a dead or made-up function fails).
pub fn check_function(f: CUfunction) -> Res {
    function_index(&table(), f).map(|_| ())
}

/// A function attribute: what was set, else a plausible value for an H100-class device.
pub fn attribute(f: CUfunction, attr: i32) -> Result<i32, CUresult> {
    let t = table();
    let i = function_index(&t, f)?;
    if let Some(&v) = t.functions[i].set.get(&attr) {
        return Ok(v);
    }
    Ok(match attr {
        0 => 1024,    // MAX_THREADS_PER_BLOCK
        1 => 0,       // SHARED_SIZE_BYTES (static shared memory)
        2 => 0,       // CONST_SIZE_BYTES
        3 => 0,       // LOCAL_SIZE_BYTES
        4 => 32,      // NUM_REGS
        5 => 90,      // PTX_VERSION
        6 => 90,      // BINARY_VERSION
        7 => 0,       // CACHE_MODE_CA
        8 => 49152,   // MAX_DYNAMIC_SHARED_SIZE_BYTES (default, raisable to the opt-in limit)
        9 => -1,      // PREFERRED_SHARED_MEMORY_CARVEOUT (no preference)
        10..=15 => 0, // cluster attributes: none required
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// Sets a settable attribute (dynamic shared memory up to the device's opt-in limit, carveout,
/// cluster attributes); others are CUDA_ERROR_INVALID_VALUE.
pub fn set_attribute(f: CUfunction, attr: i32, value: i32) -> Res {
    let ok = match attr {
        8 => (0..=232448).contains(&value),
        9 => (-1..=100).contains(&value),
        10..=15 => value >= 0,
        _ => false,
    };
    if !ok {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut t = table();
    let i = function_index(&t, f)?;
    t.functions[i].set.insert(attr, value);
    Ok(())
}

/// Address and size of global `name` of module `m`, allocating (and initializing) it on first
/// use: on the module's device, or for a library on `current` (the current context's device;
/// None: no context is current, CUDA_ERROR_INVALID_CONTEXT). Unknown names are
/// CUDA_ERROR_NOT_FOUND, as for a real driver.
pub fn global(m: CUmodule, name: &str, current: Option<i32>) -> Result<(u64, u64), CUresult> {
    let mut t = table();
    let i = live(&t, m)?;
    let module = &mut t.modules[i];
    let dev = module.dev.or(current).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    let key = (dev, name.to_string());
    if let Some(&g) = module.globals.get(&key) {
        return Ok(g);
    }
    let g = module
        .symbols
        .globals
        .get(name)
        .ok_or(CUDA_ERROR_NOT_FOUND)?;
    let size = g.size;
    let ptr = mem::alloc(dev, size.max(1), Kind::Global)?;
    // SAFETY: a fresh allocation of at least `size` bytes; `init` is at most `size` long.
    unsafe {
        std::ptr::write_bytes(ptr as *mut u8, 0, size as usize);
        std::ptr::copy_nonoverlapping(
            g.init.as_ptr(),
            ptr as *mut u8,
            g.init.len().min(size as usize),
        );
    }
    module.globals.insert(key, (ptr, size));
    Ok((ptr, size))
}

/// Reads the symbols of the image at `p`: a cubin, a fat binary, a fat-binary wrapper or PTX
/// (nothing to read).
///
/// # Safety
/// `p` is NULL or points to a whole image of one of those kinds, as the API requires.
pub unsafe fn read_image(p: *const u8) -> Symbols {
    let mut s = Symbols::default();
    if p.is_null() {
        return s;
    }
    // SAFETY: every image kind starts with at least a 4-byte magic.
    let magic = unsafe { (p as *const u32).read_unaligned() };
    match magic {
        image::ELF_MAGIC => {
            // SAFETY: the ELF header is 64 bytes; the section table and the sections are
            // within the image per its own header (bounded by MAX_IMAGE).
            unsafe {
                let head = std::slice::from_raw_parts(p, 64);
                let Some(table_end) = image::elf_table_end(head).filter(|&e| e <= image::MAX_IMAGE)
                else {
                    return s;
                };
                let head = std::slice::from_raw_parts(p, table_end as usize);
                let Some(end) = image::elf_extent(head).filter(|&e| e <= image::MAX_IMAGE) else {
                    return s;
                };
                image::read_elf(std::slice::from_raw_parts(p, end as usize), &mut s);
            }
        }
        image::FATBIN_MAGIC => {
            // SAFETY: a fat binary's 16-byte header gives its whole size.
            unsafe { read_fatbin_at(p, &mut s) }
        }
        image::FATBIN_WRAPPER_MAGIC => {
            // SAFETY: the wrapper is {magic, version, data*, prelinked*}.
            unsafe {
                let version = (p.add(4) as *const u32).read_unaligned();
                let data = (p.add(8) as *const *const u8).read_unaligned();
                if version == 1 || version == 2 {
                    read_fatbin_at(data, &mut s);
                }
            }
        }
        _ => {}
    }
    s
}

/// # Safety
/// `p` is NULL or points to a whole fat binary.
unsafe fn read_fatbin_at(p: *const u8, s: &mut Symbols) {
    if p.is_null() {
        return;
    }
    // SAFETY: the header is 16 bytes; the size it gives is the fat binary's own.
    unsafe {
        let head = std::slice::from_raw_parts(p, 16);
        if let Some(n) = image::fatbin_extent(head).filter(|&n| n <= image::MAX_IMAGE) {
            image::read_fatbin(std::slice::from_raw_parts(p, n as usize), s);
        }
    }
}
