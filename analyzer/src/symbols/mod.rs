//! Call stacks from the trace's `Stack` and `Module` records. A frame is named from the module's
//! ELF file when it is still on this machine and unchanged (`func (file.c:12)` with DWARF line
//! tables, `func (module)` with only a symbol table), else as `module+0xoffset`.

use std::collections::HashMap;

use crate::fastmap::FastMap;
use elf::ElfFile;

mod elf;

#[derive(Clone, Debug)]
pub struct Module {
    pub base: u64,
    pub size: u64,
    pub file_offset: u64,
    pub path: String,
}

/// One frame, named as well as the files allow.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    /// The module's file name (no directory), "" when no module covers the address.
    pub module: String,
    /// How the frame is shown.
    pub text: String,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

pub struct Symbolizer {
    modules: Vec<Module>,
    sorted: bool,
    stacks: FastMap<u32, Vec<u64>>,
    /// Read the modules' ELF files (off: `VRAMSHIM_SYMBOLIZE=0`, or for golden output).
    use_files: bool,
    /// Files modified after this (wall ns) are not trusted; 0 = unknown.
    trace_start_wall_ns: u64,
    files: HashMap<String, Option<ElfFile>>,
    cache: FastMap<u64, Resolved>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Symbolizer {
            modules: Vec::new(),
            sorted: false,
            stacks: FastMap::default(),
            use_files: std::env::var("VRAMSHIM_SYMBOLIZE").map_or(true, |v| v != "0"),
            trace_start_wall_ns: 0,
            files: HashMap::new(),
            cache: FastMap::default(),
        }
    }
}

/// Frames inside these modules are the allocation machinery itself, not the caller.
const MACHINERY: [&str; 3] = ["libvramshim", "libcuda", "libcudart"];

fn base_name(path: &str) -> &str {
    match path.rsplit('/').next() {
        Some("") | None => "[anon]",
        Some(n) => n,
    }
}

impl Symbolizer {
    /// Module files modified after the trace began (wall-clock ns) are not used.
    pub fn set_trace_start(&mut self, wall_ns: u64) {
        self.trace_start_wall_ns = wall_ns;
    }
    pub fn add_module(&mut self, m: Module) {
        self.modules.push(m);
        self.sorted = false;
        self.cache.clear();
    }
    pub fn add_stack(&mut self, id: u32, frames: Vec<u64>) {
        self.stacks.insert(id, frames);
    }
    pub fn has_stack(&self, id: u32) -> bool {
        self.stacks.contains_key(&id)
    }
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    fn prepare(&mut self) {
        if !self.sorted {
            self.modules.sort_by_key(|m| m.base);
            self.sorted = true;
        }
    }

    /// The module mapping that covers `addr`: the latest one starting at or below it (modules
    /// may be re-reported).
    fn module_of(&mut self, addr: u64) -> Option<&Module> {
        self.prepare();
        let i = self.modules.partition_point(|m| m.base <= addr);
        self.modules[..i]
            .iter()
            .rev()
            .take(8)
            .find(|m| addr < m.base.saturating_add(m.size))
    }

    /// One address, named.
    pub fn resolve(&mut self, addr: u64) -> Resolved {
        if let Some(r) = self.cache.get(&addr) {
            return r.clone();
        }
        let r = self.resolve_uncached(addr);
        self.cache.insert(addr, r.clone());
        r
    }

    fn resolve_uncached(&mut self, addr: u64) -> Resolved {
        let (use_files, start) = (self.use_files, self.trace_start_wall_ns);
        let Some(m) = self.module_of(addr).cloned() else {
            return Resolved {
                text: format!("0x{addr:x}"),
                ..Resolved::default()
            };
        };
        let module = base_name(&m.path).to_string();
        let offset = addr - m.base;
        let sym = if use_files {
            self.files
                .entry(m.path.clone())
                .or_insert_with(|| ElfFile::open(&m.path, start))
                .as_ref()
                .and_then(|f| f.lookup(m.file_offset, m.size, offset))
        } else {
            None
        };
        let Some(sym) = sym else {
            return Resolved {
                text: format!("{module}+0x{:x}", offset + m.file_offset),
                module,
                ..Resolved::default()
            };
        };
        let text = match (&sym.file, sym.line) {
            (Some(f), Some(l)) => format!("{} ({}:{l})", sym.function, base_name(f)),
            _ => format!("{} ({module})", sym.function),
        };
        Resolved {
            module,
            text,
            function: Some(sym.function),
            file: sym.file,
            line: sym.line,
        }
    }

    /// One address as text.
    pub fn frame(&mut self, addr: u64) -> String {
        self.resolve(addr).text
    }

    fn addrs(&self, id: u32) -> Option<Vec<u64>> {
        self.stacks.get(&id).cloned()
    }

    /// The frames of a stack, innermost first, at most `max` of them.
    pub fn frames(&mut self, id: u32, max: usize) -> Vec<String> {
        self.resolved_frames(id, max)
            .into_iter()
            .map(|r| r.text)
            .collect()
    }

    /// The frames of a stack with their parts (`text` alone for a stack missing from the trace).
    pub fn resolved_frames(&mut self, id: u32, max: usize) -> Vec<Resolved> {
        if id == 0 {
            return vec![];
        }
        let Some(addrs) = self.addrs(id) else {
            return vec![Resolved {
                text: format!("[stack {id} not in trace]"),
                ..Resolved::default()
            }];
        };
        addrs.iter().take(max).map(|&a| self.resolve(a)).collect()
    }

    /// A short name for a call site: its first frame outside CUDA and vramshim.
    pub fn label(&mut self, id: u32) -> String {
        let frames = self.resolved_frames(id, 64);
        if frames.is_empty() {
            return "(no stack recorded)".into();
        }
        let i = frames
            .iter()
            .position(|f| !MACHINERY.iter().any(|m| f.module.starts_with(m)))
            .unwrap_or(0);
        frames[i].text.clone()
    }
}
