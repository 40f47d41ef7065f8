//! Call stacks from the trace's `Stack` and `Module` records, as `module+0xoffset` frames.

use super::super::formats::FastMap;

#[derive(Clone, Debug)]
pub struct Module {
    pub base: u64,
    pub size: u64,
    pub file_offset: u64,
    pub path: String,
}

#[derive(Default)]
pub struct Symbolizer {
    modules: Vec<Module>,
    sorted: bool,
    stacks: FastMap<u32, Vec<u64>>,
}

/// Frames inside these modules are the allocation machinery itself, not the caller.
const MACHINERY: [&str; 3] = ["libvramshim", "libcuda", "libcudart"];

impl Symbolizer {
    pub fn add_module(&mut self, m: Module) {
        self.modules.push(m);
        self.sorted = false;
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

    /// One address as `libfoo.so+0x1234` (or bare hex when no module covers it).
    pub fn frame(&mut self, addr: u64) -> String {
        self.prepare();
        let i = self.modules.partition_point(|m| m.base <= addr);
        // The latest mapping starting at or below addr that covers it (modules may be re-reported).
        for m in self.modules[..i].iter().rev().take(8) {
            if addr < m.base.saturating_add(m.size) {
                let name = m.path.rsplit('/').next().unwrap_or(&m.path);
                let name = if name.is_empty() { "[anon]" } else { name };
                return format!("{name}+0x{:x}", addr - m.base + m.file_offset);
            }
        }
        format!("0x{addr:x}")
    }

    /// The frames of a stack, innermost first, at most `max` of them.
    pub fn frames(&mut self, id: u32, max: usize) -> Vec<String> {
        if id == 0 {
            return vec![];
        }
        let Some(addrs) = self.stacks.get(&id).cloned() else {
            return vec![format!("[stack {id} not in trace]")];
        };
        addrs.iter().take(max).map(|&a| self.frame(a)).collect()
    }

    /// A short name for a call site: its first frame outside CUDA and vramshim.
    pub fn label(&mut self, id: u32) -> String {
        let frames = self.frames(id, 64);
        if frames.is_empty() {
            return "(no stack recorded)".into();
        }
        frames
            .iter()
            .find(|f| !MACHINERY.iter().any(|m| f.starts_with(m)))
            .unwrap_or(&frames[0])
            .clone()
    }
}
