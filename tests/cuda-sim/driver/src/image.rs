//! What the driver reads from a module image: the data objects (module globals: `__device__`
//! and `__constant__` variables) of a cubin's ELF symbol table, with their sizes and initial
//! bytes, and the kernels (`STT_FUNC` symbols). Images come as a cubin (ELF), a fat binary
//! (`0xBA55ED50` header, entries of PTX or ELF, possibly LZ4- or Zstandard-compressed), a fat-binary wrapper
//! (`0x466243B1`, what `nvcc` embeds and the runtime registers) or PTX text (nothing read from
//! it). Everything here works on byte slices and is bounds-checked: a malformed image gives
//! fewer symbols, never a panic or a read outside the slice.

use std::collections::BTreeMap;

/// A data object of the image: size and initial contents (shorter than `size` for
/// zero-initialized tails).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Global {
    pub size: u64,
    pub init: Vec<u8>,
}

/// What was read from an image.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    pub globals: BTreeMap<String, Global>,
    pub kernels: Vec<String>,
    /// At least one cubin was read (PTX-only or unreadable images have none).
    pub parsed: bool,
}

pub const ELF_MAGIC: u32 = 0x464c_457f;
pub const FATBIN_MAGIC: u32 = 0xba55_ed50;
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;

/// Largest image or decompressed entry read (a bound against hostile headers).
pub const MAX_IMAGE: u64 = 1 << 30;

fn u16_at(b: &[u8], off: u64) -> Option<u16> {
    let o = usize::try_from(off).ok()?;
    Some(u16::from_le_bytes(
        b.get(o..o.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(b: &[u8], off: u64) -> Option<u32> {
    let o = usize::try_from(off).ok()?;
    Some(u32::from_le_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], off: u64) -> Option<u64> {
    let o = usize::try_from(off).ok()?;
    Some(u64::from_le_bytes(
        b.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}
fn slice(b: &[u8], off: u64, len: u64) -> Option<&[u8]> {
    let o = usize::try_from(off).ok()?;
    let l = usize::try_from(len).ok()?;
    b.get(o..o.checked_add(l)?)
}

/// ELF64 section header fields used here.
struct Section {
    ty: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

fn sections(elf: &[u8]) -> Option<Vec<Section>> {
    let shoff = u64_at(elf, 0x28)?;
    let shentsize = u16_at(elf, 0x3a)? as u64;
    let shnum = u16_at(elf, 0x3c)? as u64;
    if shentsize < 0x40 {
        return None;
    }
    (0..shnum)
        .map(|i| {
            let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
            Some(Section {
                ty: u32_at(elf, h + 4)?,
                offset: u64_at(elf, h + 0x18)?,
                size: u64_at(elf, h + 0x20)?,
                link: u32_at(elf, h + 0x28)?,
                entsize: u64_at(elf, h + 0x38)?,
            })
        })
        .collect()
}

const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;

/// How many bytes an ELF image at the start of `head` spans, from its header and section
/// table (`None` if it is not a 64-bit ELF). `head` needs only the ELF header and, for the
/// second call, the section table: [`elf_extent`] is called with what is known so far.
pub fn elf_table_end(head: &[u8]) -> Option<u64> {
    if u32_at(head, 0)? != ELF_MAGIC || *head.get(4)? != 2 {
        return None;
    }
    let shoff = u64_at(head, 0x28)?;
    let shentsize = u16_at(head, 0x3a)? as u64;
    let shnum = u16_at(head, 0x3c)? as u64;
    shoff.checked_add(shentsize.checked_mul(shnum)?)
}

/// The whole extent of an ELF image, given at least its header and section table.
pub fn elf_extent(head: &[u8]) -> Option<u64> {
    let mut end = elf_table_end(head)?;
    for s in sections(head)? {
        if s.ty != 8 {
            end = end.max(s.offset.checked_add(s.size)?);
        }
    }
    Some(end)
}

/// Adds the objects and functions of cubin `elf` to `out`.
pub fn read_elf(elf: &[u8], out: &mut Symbols) {
    let Some(secs) = sections(elf) else { return };
    let mut any = false;
    for symtab in secs.iter().filter(|s| s.ty == SHT_SYMTAB) {
        let Some(strtab) = secs.get(symtab.link as usize) else {
            continue;
        };
        let Some(names) = slice(elf, strtab.offset, strtab.size) else {
            continue;
        };
        let entsize = if symtab.entsize == 0 {
            24
        } else {
            symtab.entsize
        };
        if entsize < 24 {
            continue;
        }
        any = true;
        for i in 0..symtab.size / entsize {
            let e = symtab.offset + i * entsize;
            let (Some(name_off), Some(info), Some(shndx), Some(value), Some(size)) = (
                u32_at(elf, e),
                elf.get(usize::try_from(e + 4).unwrap_or(usize::MAX))
                    .copied(),
                u16_at(elf, e + 6),
                u64_at(elf, e + 8),
                u64_at(elf, e + 16),
            ) else {
                break;
            };
            let Some(name) = names
                .get(name_off as usize..)
                .and_then(|n| n.split(|&c| c == 0).next())
                .and_then(|n| std::str::from_utf8(n).ok())
                .filter(|n| !n.is_empty())
            else {
                continue;
            };
            match info & 0xf {
                STT_OBJECT => {
                    // Initial bytes from a PROGBITS section (st_value is the offset in it);
                    // NOBITS (.bss) objects start zeroed.
                    let init = secs
                        .get(shndx as usize)
                        .filter(|s| s.ty == SHT_PROGBITS)
                        .and_then(|s| {
                            let avail = s.size.checked_sub(value)?.min(size);
                            slice(elf, s.offset.checked_add(value)?, avail)
                        })
                        .map(<[u8]>::to_vec)
                        .unwrap_or_default();
                    out.globals
                        .entry(name.to_string())
                        .or_insert(Global { size, init });
                }
                STT_FUNC if !out.kernels.iter().any(|k| k == name) => {
                    out.kernels.push(name.to_string())
                }
                _ => {}
            }
        }
    }
    out.parsed |= any;
}

/// Size of a fat binary at the start of `head` (header + entries), if it is one.
pub fn fatbin_extent(head: &[u8]) -> Option<u64> {
    if u32_at(head, 0)? != FATBIN_MAGIC {
        return None;
    }
    let header = u16_at(head, 6)? as u64;
    header.checked_add(u64_at(head, 8)?)
}

const FATBIN_KIND_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;

/// Adds the symbols of every cubin entry of fat binary `fb` (one whole fat binary) to `out`.
/// Entries compressed with LZ4 or Zstandard are decompressed.
pub fn read_fatbin(fb: &[u8], out: &mut Symbols) {
    let Some(header) = u16_at(fb, 6) else { return };
    let mut off = header as u64;
    while let (Some(kind), Some(hsize), Some(payload)) =
        (u16_at(fb, off), u32_at(fb, off + 4), u64_at(fb, off + 8))
    {
        let flags = u64_at(fb, off + 40).unwrap_or(0);
        let body = off.checked_add(hsize as u64);
        if kind == FATBIN_KIND_ELF
            && let Some(data) = body.and_then(|b| slice(fb, b, payload))
        {
            if flags & FLAG_LZ4 != 0 {
                let compressed = u32_at(fb, off + 16).unwrap_or(0) as u64;
                let full = u64_at(fb, off + 56).unwrap_or(0);
                if let Some(c) = data.get(..compressed.min(payload) as usize)
                    && full <= MAX_IMAGE
                    && let Some(elf) = lz4_block_decompress(c, full as usize)
                {
                    read_elf(&elf, out);
                }
            } else if flags & FLAG_ZSTD != 0 {
                let compressed = u32_at(fb, off + 16).unwrap_or(0) as u64;
                let full = u64_at(fb, off + 56).unwrap_or(0);
                if let Some(c) = data.get(..compressed.min(payload) as usize)
                    && full <= MAX_IMAGE
                    && let Ok(elf) = zstd::bulk::decompress(c, full as usize)
                {
                    read_elf(&elf, out);
                }
            } else {
                read_elf(data, out);
            }
        }
        match body.and_then(|b| b.checked_add(payload)) {
            Some(next) if next > off && hsize > 0 => off = next,
            _ => break,
        }
    }
}

/// Decompresses an LZ4 block (the LZ4 block format: sequences of a token, literal length,
/// literals, a 2-byte match offset and match length) of known decompressed size.
pub fn lz4_block_decompress(src: &[u8], size: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(size);
    let mut i = 0usize;
    let read_len = |i: &mut usize, mut n: usize| -> Option<usize> {
        if n == 15 {
            loop {
                let b = *src.get(*i)?;
                *i += 1;
                n = n.checked_add(b as usize)?;
                if b != 255 {
                    break;
                }
            }
        }
        Some(n)
    };
    while i < src.len() {
        let token = src[i];
        i += 1;
        let lit = read_len(&mut i, (token >> 4) as usize)?;
        out.extend_from_slice(src.get(i..i.checked_add(lit)?)?);
        i += lit;
        if out.len() > size {
            return None;
        }
        if i >= src.len() {
            break; // the last sequence has literals only
        }
        let offset = u16::from_le_bytes(src.get(i..i + 2)?.try_into().ok()?) as usize;
        i += 2;
        if offset == 0 || offset > out.len() {
            return None;
        }
        let len = read_len(&mut i, (token & 0xf) as usize)?.checked_add(4)?;
        if out.len() + len > size {
            return None;
        }
        let start = out.len() - offset;
        for k in 0..len {
            let b = out[start + k];
            out.push(b);
        }
    }
    (out.len() == size).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with sections: null, .data (PROGBITS), .bss (NOBITS), .symtab, .strtab,
    /// symbols: `weights` (8 bytes in .data), `counter` (4 bytes in .bss), `kern` (FUNC).
    pub(crate) fn tiny_cubin() -> Vec<u8> {
        let data: &[u8] = &[1, 2, 3, 4, 5, 6, 7, 8];
        let strtab: &[u8] = b"\0weights\0counter\0kern\0";
        let sym = |name: u32, info: u8, shndx: u16, value: u64, size: u64| {
            let mut s = Vec::new();
            s.extend_from_slice(&name.to_le_bytes());
            s.push(info);
            s.push(0);
            s.extend_from_slice(&shndx.to_le_bytes());
            s.extend_from_slice(&value.to_le_bytes());
            s.extend_from_slice(&size.to_le_bytes());
            s
        };
        let mut symtab = vec![0u8; 24];
        symtab.extend(sym(1, 0x11, 1, 0, 8));
        symtab.extend(sym(9, 0x11, 2, 0, 4));
        symtab.extend(sym(17, 0x12, 0, 0, 0));
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(&ELF_MAGIC.to_le_bytes());
        elf[4] = 2;
        let data_off = elf.len() as u64;
        elf.extend_from_slice(data);
        let symtab_off = elf.len() as u64;
        elf.extend_from_slice(&symtab);
        let strtab_off = elf.len() as u64;
        elf.extend_from_slice(strtab);
        let shoff = elf.len() as u64;
        let sh = |ty: u32, off: u64, size: u64, link: u32, entsize: u64| {
            let mut h = vec![0u8; 64];
            h[4..8].copy_from_slice(&ty.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&off.to_le_bytes());
            h[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            h[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
            h[0x38..0x40].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        elf.extend(sh(0, 0, 0, 0, 0));
        elf.extend(sh(1, data_off, 8, 0, 0));
        elf.extend(sh(8, 0, 4, 0, 0));
        elf.extend(sh(2, symtab_off, symtab.len() as u64, 4, 24));
        elf.extend(sh(3, strtab_off, strtab.len() as u64, 0, 0));
        elf[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&5u16.to_le_bytes());
        elf
    }

    #[test]
    fn elf_objects_and_functions() {
        let elf = tiny_cubin();
        assert_eq!(elf_extent(&elf), Some(elf.len() as u64));
        let mut s = Symbols::default();
        read_elf(&elf, &mut s);
        assert!(s.parsed);
        assert_eq!(
            s.globals["weights"],
            Global {
                size: 8,
                init: vec![1, 2, 3, 4, 5, 6, 7, 8]
            }
        );
        assert_eq!(
            s.globals["counter"],
            Global {
                size: 4,
                init: vec![]
            }
        );
        assert_eq!(s.kernels, ["kern"]);
    }

    #[test]
    fn truncated_or_garbage_images_give_no_symbols_and_no_panic() {
        let elf = tiny_cubin();
        for cut in 0..elf.len() {
            let mut s = Symbols::default();
            read_elf(&elf[..cut], &mut s);
            read_fatbin(&elf[..cut], &mut s);
        }
        let mut junk = elf.clone();
        for (i, b) in junk.iter_mut().enumerate().skip(64) {
            *b = (i * 37) as u8;
        }
        let mut s = Symbols::default();
        read_elf(&junk, &mut s);
        assert!(lz4_block_decompress(&[0xff; 40], 100).is_none());
    }

    fn fatbin(entries: &[(u64, Vec<u8>, u64)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (flags, payload, full) in entries {
            let mut h = vec![0u8; 64];
            h[..2].copy_from_slice(&FATBIN_KIND_ELF.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            h[40..48].copy_from_slice(&flags.to_le_bytes());
            h[56..64].copy_from_slice(&full.to_le_bytes());
            body.extend(h);
            body.extend_from_slice(payload);
        }
        let mut fb = vec![0u8; 16];
        fb[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fb[6..8].copy_from_slice(&16u16.to_le_bytes());
        fb[8..16].copy_from_slice(&(body.len() as u64).to_le_bytes());
        fb.extend(body);
        fb
    }

    /// LZ4 as literals only (a valid block: one sequence, no match).
    fn lz4_literals(data: &[u8]) -> Vec<u8> {
        let mut v = vec![0xf0];
        let mut n = data.len() - 15;
        while n >= 255 {
            v.push(255);
            n -= 255;
        }
        v.push(n as u8);
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn fatbin_plain_and_lz4_entries() {
        let elf = tiny_cubin();
        let fb = fatbin(&[(0, elf.clone(), 0)]);
        assert_eq!(fatbin_extent(&fb), Some(fb.len() as u64));
        let mut s = Symbols::default();
        read_fatbin(&fb, &mut s);
        assert_eq!(s.globals.len(), 2);
        let fb = fatbin(&[(FLAG_LZ4, lz4_literals(&elf), elf.len() as u64)]);
        let mut s = Symbols::default();
        read_fatbin(&fb, &mut s);
        assert_eq!(s.globals["weights"].size, 8);
        let z = zstd::bulk::compress(&elf, 3).unwrap();
        let fb = fatbin(&[(FLAG_ZSTD, z, elf.len() as u64)]);
        let mut s = Symbols::default();
        read_fatbin(&fb, &mut s);
        assert_eq!(s.globals["counter"].size, 4);
        // A Zstandard entry that is not one is skipped.
        let fb = fatbin(&[(FLAG_ZSTD, elf.clone(), elf.len() as u64)]);
        let mut s = Symbols::default();
        read_fatbin(&fb, &mut s);
        assert!(!s.parsed);
    }

    #[test]
    fn lz4_matches_copy_overlapping() {
        // "abc" then a match of offset 3, length 9: "abcabcabcabc".
        let block = [0x35, b'a', b'b', b'c', 3, 0, 0x00];
        // The format ends with literals: add an empty final sequence.
        let out = lz4_block_decompress(&block[..6], 12).unwrap();
        assert_eq!(out, b"abcabcabcabc");
    }
}
