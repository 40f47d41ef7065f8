//! Function names and source lines for return addresses, from the module's ELF file on this
//! machine: its symbol tables, and its DWARF line tables when it has them (addr2line).
//!
//! A trace records each executable segment as (load address, size, file offset, path), so an
//! address maps to a file offset; the file's own program headers turn that into the virtual
//! address the symbol and line tables use. The file is trusted only when it still has a segment
//! at that offset with that size and was not modified after the trace began; otherwise (missing,
//! rebuilt, not ELF) the caller keeps `module+0xoffset`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::UNIX_EPOCH;

/// What the ELF file says about one address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Symbol {
    pub function: String,
    /// Source file (as recorded in DWARF) and line, when the file has line tables.
    pub file: Option<String>,
    pub line: Option<u32>,
}

pub struct ElfFile {
    loader: addr2line::Loader,
    /// Loadable segments: (file offset, virtual address, size in memory).
    loads: Vec<(u64, u64, u64)>,
}

const PT_LOAD: u32 = 1;

/// The PT_LOAD program headers of a little-endian ELF64 file (all vramshim runs on).
fn load_segments(path: &Path) -> Option<Vec<(u64, u64, u64)>> {
    let mut f = File::open(path).ok()?;
    let mut head = vec![0u8; 64];
    f.read_exact(&mut head).ok()?;
    if &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as u64;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (
        u64_at(&head, 0x20),
        u16_at(&head, 0x36),
        u16_at(&head, 0x38),
    );
    if phentsize < 56 || phnum == 0 || phnum > 4096 {
        return None;
    }
    let mut table = vec![0u8; (phentsize * phnum) as usize];
    f.seek(SeekFrom::Start(phoff)).ok()?;
    f.read_exact(&mut table).ok()?;
    Some(
        table
            .chunks_exact(phentsize as usize)
            .filter(|p| u32_at(p, 0) == PT_LOAD)
            .map(|p| (u64_at(p, 8), u64_at(p, 16), u64_at(p, 40)))
            .collect(),
    )
}

fn modified_ns(path: &Path) -> Option<u64> {
    let t = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_nanos() as u64)
}

impl ElfFile {
    /// Opens `path` when it is an ELF file not modified after `trace_start_wall_ns` (0 = unknown:
    /// not checked).
    pub fn open(path: &str, trace_start_wall_ns: u64) -> Option<ElfFile> {
        let p = Path::new(path);
        if path.is_empty() || !p.is_absolute() {
            return None;
        }
        if trace_start_wall_ns > 0 && modified_ns(p)? > trace_start_wall_ns {
            return None;
        }
        let loads = load_segments(p)?;
        let loader = addr2line::Loader::new(p).ok()?;
        Some(ElfFile { loader, loads })
    }

    /// The function (and line) at `offset` bytes into the segment that starts at `file_offset`
    /// in the file and is `size` bytes long in memory; `None` when the file has no such segment
    /// (it changed) or no symbol covers the address.
    pub fn lookup(&self, file_offset: u64, size: u64, offset: u64) -> Option<Symbol> {
        let &(_, vaddr, _) = self
            .loads
            .iter()
            .find(|&&(o, _, s)| o == file_offset && s == size)?;
        // A return address points after the call: look up the call instruction.
        let probe = vaddr.checked_add(offset)?.checked_sub(1)?;
        let mut out = None;
        if let Ok(mut frames) = self.loader.find_frames(probe) {
            // Inlined callees come first; the source line is the innermost one's, the name too
            // (that is the code that made the call).
            if let Ok(Some(f)) = frames.next() {
                let function = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok())
                    .map(|n| n.into_owned());
                if let Some(function) = function {
                    out = Some(Symbol {
                        function,
                        file: f.location.as_ref().and_then(|l| l.file).map(str::to_string),
                        line: f.location.as_ref().and_then(|l| l.line),
                    });
                }
            }
        }
        out.or_else(|| {
            let name = self.loader.find_symbol(probe)?;
            Some(Symbol {
                function: addr2line::demangle_auto(name.into(), None).into_owned(),
                file: None,
                line: None,
            })
        })
    }
}
