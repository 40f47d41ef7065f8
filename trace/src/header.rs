//! File preamble: magic, format version, header length, header payload.

use crate::event::{DeviceInfo, Header};
use crate::wire::{Cur, RecordError, put_str, put_varint, unzigzag, zigzag};

/// First bytes of every `.vramtrace` file (PNG style: a high byte, the name, CR LF, ^Z, LF).
pub const MAGIC: [u8; 14] = *b"\x89VRAMTRACE\r\n\x1a\n";
/// The format version this crate writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 5;
/// Format version that introduced columnar frames (`VRFC`).
pub const COLUMNAR_SINCE: u32 = 2;
/// Format version that introduced `TorchRun` records and the torch stream of columnar frames.
pub const TORCH_RUN_SINCE: u32 = 4;
/// Format version that introduced chained contexts: a `Context` record that names a model
/// slot, whose `TorchRun` model continues across frames.
pub const CHAINED_SINCE: u32 = 5;
/// Largest header payload a reader accepts.
pub const MAX_HEADER: usize = 4 << 20;
/// Largest number of cmdline words, devices or config entries a reader accepts.
pub const MAX_LIST: u64 = 1 << 16;

/// Encodes the header payload (without magic, version and length).
pub(crate) fn encode_header(h: &Header) -> Vec<u8> {
    let mut b = Vec::with_capacity(256);
    put_varint(&mut b, h.pid as u64);
    put_varint(&mut b, h.ppid as u64);
    put_str(&mut b, &h.host);
    put_varint(&mut b, h.cmdline.len() as u64);
    for a in &h.cmdline {
        put_str(&mut b, a);
    }
    put_varint(&mut b, h.start_wall_ns);
    put_varint(&mut b, h.start_mono_ns);
    put_varint(&mut b, h.devices.len() as u64);
    for d in &h.devices {
        put_varint(&mut b, zigzag(d.index as i64));
        put_varint(&mut b, d.total_bytes);
        put_str(&mut b, &d.name);
    }
    put_varint(&mut b, h.config.len() as u64);
    for (k, v) in &h.config {
        put_str(&mut b, k);
        put_str(&mut b, v);
    }
    b
}

/// Encodes magic + version + length + payload.
pub(crate) fn encode_preamble(h: &Header) -> Vec<u8> {
    let payload = encode_header(h);
    let mut out = Vec::with_capacity(MAGIC.len() + 8 + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

fn list_len(c: &mut Cur) -> Result<usize, RecordError> {
    let n = c.varint()?;
    // Every element takes at least one byte, so the payload length bounds it too.
    if n > MAX_LIST || n as usize > c.b.len() {
        return Err(RecordError::BadValue("list length"));
    }
    Ok(n as usize)
}

/// Decodes the header payload. Trailing bytes (fields added by newer minor writers) are ignored.
pub(crate) fn decode_header(payload: &[u8], version: u32) -> Result<Header, RecordError> {
    let mut c = Cur::new(payload);
    let mut h = Header {
        format_version: version,
        pid: c.u32v()?,
        ppid: c.u32v()?,
        host: c.string()?,
        ..Default::default()
    };
    let n = list_len(&mut c)?;
    for _ in 0..n {
        h.cmdline.push(c.string()?);
    }
    h.start_wall_ns = c.varint()?;
    h.start_mono_ns = c.varint()?;
    let n = list_len(&mut c)?;
    for _ in 0..n {
        let index = i32::try_from(unzigzag(c.varint()?))
            .map_err(|_| RecordError::BadValue("device index"))?;
        let total_bytes = c.varint()?;
        let name = c.string()?;
        h.devices.push(DeviceInfo {
            uuid: None,
            index,
            name,
            total_bytes,
        });
    }
    let n = list_len(&mut c)?;
    for _ in 0..n {
        let k = c.string()?;
        let v = c.string()?;
        h.config.push((k, v));
    }
    Ok(h)
}
