//! The loaded-module map (`dl_iterate_phdr`), written as `Module` records so that the
//! analyzer can symbolize return addresses after the process is gone.

use std::ffi::{CStr, c_int, c_void};

use vramshim_trace::Event;

/// Executable segments already written (by load address).
#[derive(Default)]
pub(crate) struct ModuleMap {
    seen: Vec<(u64, u64)>,
    /// glibc's load/unload counters at the last scan (`dlpi_adds`, `dlpi_subs`).
    adds: u64,
    subs: u64,
    exe: Option<String>,
}

struct Scan<'a> {
    map: &'a mut ModuleMap,
    out: &'a mut Vec<Event>,
    adds: u64,
    subs: u64,
}

extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, arg: *mut c_void) -> c_int {
    // SAFETY: arg is the Scan passed by `scan`; info is valid during the callback.
    let (s, info) = unsafe { (&mut *(arg as *mut Scan), &*info) };
    s.adds = info.dlpi_adds;
    s.subs = info.dlpi_subs;
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let path = if name.is_empty() {
        // The main program: the loader gives no name.
        s.map
            .exe
            .get_or_insert_with(|| {
                std::fs::read_link("/proc/self/exe")
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default()
            })
            .clone()
    } else {
        name
    };
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_X == 0 {
            continue;
        }
        let base = info.dlpi_addr.wrapping_add(ph.p_vaddr);
        let key = (base, ph.p_memsz);
        if s.map.seen.contains(&key) {
            continue;
        }
        s.map.seen.push(key);
        s.out.push(Event::Module {
            base,
            size: ph.p_memsz,
            file_offset: ph.p_offset,
            path: path.clone(),
        });
    }
    0
}

impl ModuleMap {
    /// Appends a `Module` event for every executable segment not written yet. Cheap when
    /// nothing was loaded since the last call (`force` = scan anyway).
    pub(crate) fn scan(&mut self, out: &mut Vec<Event>, force: bool) {
        if !force && !self.changed() {
            return;
        }
        let mut s = Scan {
            map: self,
            out,
            adds: 0,
            subs: 0,
        };
        // SAFETY: `visit` matches the callback ABI; `s` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(visit), &mut s as *mut Scan as *mut c_void) };
        let (adds, subs) = (s.adds, s.subs);
        self.adds = adds;
        self.subs = subs;
    }

    fn changed(&self) -> bool {
        extern "C" fn first(info: *mut libc::dl_phdr_info, _: usize, arg: *mut c_void) -> c_int {
            // SAFETY: as in `visit`.
            let (out, info) = unsafe { (&mut *(arg as *mut (u64, u64)), &*info) };
            *out = (info.dlpi_adds, info.dlpi_subs);
            1 // stop after the first object: the counters are global
        }
        let mut c = (0u64, 0u64);
        // SAFETY: `first` matches the callback ABI; `c` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(first), &mut c as *mut (u64, u64) as *mut c_void) };
        c != (self.adds, self.subs)
    }
}

/// The executable segment range `[lo, hi)` of the object that contains `addr`.
pub(crate) fn text_range_of(addr: u64) -> Option<(u64, u64)> {
    struct Find {
        addr: u64,
        found: Option<(u64, u64)>,
    }
    extern "C" fn find(info: *mut libc::dl_phdr_info, _: usize, arg: *mut c_void) -> c_int {
        // SAFETY: as in `visit`.
        let (f, info) = unsafe { (&mut *(arg as *mut Find), &*info) };
        let mut lo = u64::MAX;
        let mut hi = 0u64;
        let mut hit = false;
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_X == 0 {
                continue;
            }
            let b = info.dlpi_addr.wrapping_add(ph.p_vaddr);
            let e = b.wrapping_add(ph.p_memsz);
            lo = lo.min(b);
            hi = hi.max(e);
            if f.addr >= b && f.addr < e {
                hit = true;
            }
        }
        if hit {
            f.found = Some((lo, hi));
            1
        } else {
            0
        }
    }
    let mut f = Find { addr, found: None };
    // SAFETY: `find` matches the callback ABI; `f` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(find), &mut f as *mut Find as *mut c_void) };
    f.found
}
