//! Just enough of an ELF64 little-endian reader to look up *local* symbols (`.symtab`, which
//! `dlsym` cannot see) and the GNU build-id of a loaded library, read from its file. Used to
//! verify a C++ virtual slot before calling it (`tracer::torch`). Every offset and length read
//! from the file is checked against the file's size, and every read is bounded: a hostile or
//! truncated file yields `None`, never a panic or an unbounded allocation.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Most bytes read for a symbol or string table (a libc10_cuda.so's are ~100 KiB).
const MAX_TABLE: u64 = 64 << 20;
const SHT_SYMTAB: u32 = 2;
const SHT_NOTE: u32 = 7;
const SHT_DYNSYM: u32 = 11;

pub(crate) struct Elf {
    file: File,
    size: u64,
    sections: Vec<Section>,
}

#[derive(Clone, Copy)]
struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

/// A symbol found: its value (address relative to the load base) and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sym {
    pub value: u64,
    pub size: u64,
}

fn u16le(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Elf {
    pub(crate) fn open(path: &str) -> Option<Elf> {
        let file = File::open(path).ok()?;
        let size = file.metadata().ok()?.len();
        let mut eh = [0u8; 64];
        file.read_exact_at(&mut eh, 0).ok()?;
        // ELF magic, 64-bit, little-endian.
        if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
            return None;
        }
        let shoff = u64le(&eh, 0x28)?;
        let shentsize = u16le(&eh, 0x3A)? as u64;
        let shnum = u16le(&eh, 0x3C)? as u64;
        if shentsize < 64 || shnum == 0 || shnum > 65_535 {
            return None;
        }
        let len = shentsize.checked_mul(shnum)?;
        if shoff.checked_add(len)? > size || len > MAX_TABLE {
            return None;
        }
        let mut sh = vec![0u8; len as usize];
        file.read_exact_at(&mut sh, shoff).ok()?;
        let mut sections = Vec::with_capacity(shnum as usize);
        for i in 0..shnum as usize {
            let b = &sh[i * shentsize as usize..];
            sections.push(Section {
                kind: u32le(b, 4)?,
                offset: u64le(b, 0x18)?,
                size: u64le(b, 0x20)?,
                link: u32le(b, 0x28)?,
                entsize: u64le(b, 0x38)?,
            });
        }
        Some(Elf {
            file,
            size,
            sections,
        })
    }

    fn read(&self, s: &Section) -> Option<Vec<u8>> {
        if s.size > MAX_TABLE || s.offset.checked_add(s.size)? > self.size {
            return None;
        }
        let mut v = vec![0u8; s.size as usize];
        self.file.read_exact_at(&mut v, s.offset).ok()?;
        Some(v)
    }

    /// The first `.symtab` symbol whose name satisfies `want` (local symbols included).
    pub(crate) fn find_symbol(&self, want: impl Fn(&[u8]) -> bool) -> Option<Sym> {
        self.find_in(SHT_SYMTAB, want)
    }

    /// The first symbol whose name satisfies `want`, in `.symtab` or else in `.dynsym` (a
    /// stripped executable still exports its dynamic symbols, with their sizes).
    pub(crate) fn find_any_symbol(&self, want: impl Fn(&[u8]) -> bool) -> Option<Sym> {
        self.find_in(SHT_SYMTAB, &want)
            .or_else(|| self.find_in(SHT_DYNSYM, &want))
    }

    fn find_in(&self, kind: u32, want: impl Fn(&[u8]) -> bool) -> Option<Sym> {
        let st = self.sections.iter().find(|s| s.kind == kind)?;
        let strtab = self.sections.get(st.link as usize)?;
        if st.entsize < 24 {
            return None;
        }
        let syms = self.read(st)?;
        let strs = self.read(strtab)?;
        for e in syms.chunks_exact(st.entsize as usize) {
            let name_at = u32le(e, 0)? as usize;
            let Some(rest) = strs.get(name_at..) else {
                continue;
            };
            let name = &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())];
            if want(name) {
                return Some(Sym {
                    value: u64le(e, 8)?,
                    size: u64le(e, 16)?,
                });
            }
        }
        None
    }

    /// The GNU build-id (`NT_GNU_BUILD_ID` note), as lowercase hex.
    pub(crate) fn build_id(&self) -> Option<String> {
        for s in self.sections.iter().filter(|s| s.kind == SHT_NOTE) {
            let Some(b) = self.read(s) else { continue };
            let mut at = 0usize;
            while at + 12 <= b.len() {
                let namesz = u32le(&b, at)? as usize;
                let descsz = u32le(&b, at + 4)? as usize;
                let kind = u32le(&b, at + 8)?;
                let name_at = at + 12;
                let desc_at = name_at.checked_add(namesz.div_ceil(4) * 4)?;
                let end = desc_at.checked_add(descsz.div_ceil(4) * 4)?;
                if end > b.len() {
                    break;
                }
                if kind == 3 && b.get(name_at..name_at + namesz) == Some(b"GNU\0") {
                    return Some(
                        b[desc_at..desc_at + descsz]
                            .iter()
                            .map(|x| format!("{x:02x}"))
                            .collect(),
                    );
                }
                at = end;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_test_binary_and_refuses_junk() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let elf = Elf::open(exe.to_str().unwrap()).expect("own executable parses");
        // Rust test binaries keep a symtab; some symbol with "main" in it exists.
        assert!(
            elf.find_symbol(|n| n == b"main").is_some(),
            "main found in .symtab"
        );
        assert!(elf.find_symbol(|n| n == b"no such symbol at all").is_none());
        let tmp = vramshim_testkit::TempDir::new("elfsyms");
        let dir = tmp.join("short.elf");
        std::fs::write(&dir, b"\x7fELF\x02\x01junk that is far too short").unwrap();
        assert!(Elf::open(dir.to_str().unwrap()).is_none());
        // Section headers claimed past the end of the file.
        let mut h = vec![0u8; 64];
        h[..6].copy_from_slice(b"\x7fELF\x02\x01");
        h[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        h[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        h[0x3C..0x3E].copy_from_slice(&3u16.to_le_bytes());
        std::fs::write(&dir, &h).unwrap();
        assert!(Elf::open(dir.to_str().unwrap()).is_none());
    }
}
