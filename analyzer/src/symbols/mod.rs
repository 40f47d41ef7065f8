//! Call stacks from the trace's `Stack` and `Module` records. A frame is named from the module's
//! ELF file when it is still on this machine and unchanged (`func (file.c:12)` with DWARF line
//! tables, `func (module)` with only a symbol table), else as `module+0xoffset`. A Python
//! frame (bit 63 set: a `PyCode` id and a line, docs/trace-format.md) is named from the
//! trace's `PyCode` records as `function (file.py:line)`.

use std::collections::HashMap;

use crate::fastmap::FastMap;
use elf::ElfFile;

mod elf;
mod python;
pub use python::{is_user_file, short_function};

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
    /// `PyCode` id -> (file, function).
    pycodes: FastMap<u32, (String, String)>,
}

/// Marks a Python frame in a `Stack` record.
pub const PY_FRAME_BIT: u64 = 1 << 63;
/// The module name Python frames are shown with.
pub const PYTHON_MODULE: &str = "[python]";

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
            pycodes: FastMap::default(),
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
    /// A `PyCode` record: names the Python frames that refer to `id`.
    pub fn add_pycode(&mut self, id: u32, file: &str, function: &str) {
        self.pycodes
            .insert(id, (file.to_string(), function.to_string()));
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
        if addr & PY_FRAME_BIT != 0 {
            return self.resolve_python(addr);
        }
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

    fn resolve_python(&self, frame: u64) -> Resolved {
        let id = ((frame >> 32) & 0x7fff_ffff) as u32;
        let line = frame as u32;
        let Some((file, function)) = self.pycodes.get(&id) else {
            return Resolved {
                module: PYTHON_MODULE.into(),
                text: format!("[Python code {id} not in trace] (line {line})"),
                line: Some(line),
                ..Resolved::default()
            };
        };
        Resolved {
            module: PYTHON_MODULE.into(),
            text: format!("{} ({}:{line})", short_function(function), base_name(file)),
            function: Some(function.clone()),
            file: Some(file.clone()),
            line: Some(line),
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

    /// A short name for a call site: its innermost Python frame in the job's own code (else
    /// its innermost Python frame) when it has Python frames, else its first frame outside
    /// CUDA and vramshim.
    pub fn label(&mut self, id: u32) -> String {
        let frames = self.resolved_frames(id, usize::MAX);
        if frames.is_empty() {
            return "(no stack recorded)".into();
        }
        let python = |f: &&Resolved| f.module == PYTHON_MODULE;
        if let Some(f) = frames
            .iter()
            .filter(python)
            .find(|f| f.file.as_deref().is_some_and(is_user_file))
            .or_else(|| frames.iter().find(python))
        {
            return f.text.clone();
        }
        let i = frames
            .iter()
            .position(|f| !MACHINERY.iter().any(|m| f.module.starts_with(m)))
            .unwrap_or(0);
        frames[i].text.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(code: u32, line: u32) -> u64 {
        PY_FRAME_BIT | (code as u64) << 32 | line as u64
    }

    /// Python frames are named from `PyCode` records; a call site is the innermost Python
    /// frame in the job's own code, else the innermost Python frame, else the first native
    /// frame outside the CUDA libraries.
    #[test]
    fn python_frames_name_the_call_site() {
        let mut s = Symbolizer::default();
        s.add_module(Module {
            base: 0x1000,
            size: 0x1000,
            file_offset: 0,
            path: "/x/libcudart.so.12".into(),
        });
        s.add_pycode(
            1,
            "/venv/lib/python3.11/site-packages/torch/nn/linear.py",
            "Linear.forward",
        );
        s.add_pycode(2, "/job/train.py", "step.<locals>.<listcomp>");
        s.add_pycode(3, "/usr/lib/python3.11/threading.py", "Thread.run");
        s.add_stack(1, vec![0x1010, py(1, 7), py(2, 40), 0x2_0000]);
        s.add_stack(2, vec![0x1010, py(1, 7), py(3, 9)]);
        s.add_stack(3, vec![0x1010, 0x2_0000]);
        s.add_stack(4, vec![0x1010, py(9, 3)]);
        assert_eq!(s.label(1), "step (train.py:40)");
        assert_eq!(s.label(2), "Linear.forward (linear.py:7)");
        assert_eq!(s.label(3), "0x20000");
        assert_eq!(s.label(4), "[Python code 9 not in trace] (line 3)");
        let f = s.resolved_frames(1, 8);
        assert_eq!(f[1].function.as_deref(), Some("Linear.forward"));
        assert_eq!(f[2].line, Some(40));
        assert_eq!(f[2].module, PYTHON_MODULE);
    }
}
