//! The answer of the integrity-check export table (`d4082055-...`, slot 1).
//!
//! NVIDIA's runtime hands the driver a version and a time, and checks the 16 bytes it gets back
//! against its own computation; a wrong answer fails every runtime call with error 103
//! ("integrity checks failed"). For runtime versions ending in 2 the answer is HMAC (RFC 2104)
//! over MD2 (RFC 1319), keyed with a fixed 16-byte key, of: the driver version, the runtime
//! version, the process id, the low 32 bits of `pthread_self`, the addresses of the runtime
//! interface table, of the integrity table and of this function, the time, then per device its
//! UUID and PCI domain/bus/device. Other versions (ending in 0 or 1) take fixed answers.
//! See docs/cuda-sim.md ("Private export tables") for how this was established.

/// What the answer is computed over (the order and widths are part of the interface).
#[derive(Clone, Debug)]
pub struct Inputs {
    pub driver_version: u32,
    pub runtime_version: u32,
    pub pid: u32,
    pub thread: u32,
    pub runtime_table: u64,
    pub integrity_table: u64,
    pub function: u64,
    pub unix_seconds: u64,
    pub devices: Vec<Device>,
}

#[derive(Clone, Copy, Debug)]
pub struct Device {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

/// The HMAC key the runtime checks with.
const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// The fixed answers of runtime versions ending in 0 and 1.
const FIXED_0: [u64; 2] = [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8];
const FIXED_1: [u64; 2] = [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8];

/// The two 64-bit words the runtime expects (native byte order, as it reads them).
pub fn answer(i: &Inputs) -> [u64; 2] {
    match i.runtime_version % 10 {
        0 => FIXED_0,
        1 => FIXED_1,
        _ => {
            let mac = hmac_md2(&KEY, &message(i));
            [
                u64::from_ne_bytes(mac[..8].try_into().expect("8 bytes")),
                u64::from_ne_bytes(mac[8..].try_into().expect("8 bytes")),
            ]
        }
    }
}

/// The bytes hashed: little-endian fields in the order the runtime lays them out.
fn message(i: &Inputs) -> Vec<u8> {
    let mut m = Vec::with_capacity(48 + 28 * i.devices.len());
    for w in [i.driver_version, i.runtime_version, i.pid, i.thread] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    for q in [
        i.runtime_table,
        i.integrity_table,
        i.function,
        i.unix_seconds,
    ] {
        m.extend_from_slice(&q.to_le_bytes());
    }
    for d in &i.devices {
        m.extend_from_slice(&d.uuid);
        for w in [d.pci_domain, d.pci_bus, d.pci_device] {
            m.extend_from_slice(&w.to_le_bytes());
        }
    }
    m
}

/// HMAC (RFC 2104) with MD2: MD2's block is 16 bytes, so a 16-byte key is used as is.
pub fn hmac_md2(key: &[u8; 16], msg: &[u8]) -> [u8; 16] {
    let mut inner = Md2::new();
    inner.update(&key.map(|b| b ^ 0x36));
    inner.update(msg);
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&key.map(|b| b ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

/// MD2 (RFC 1319), streaming.
pub struct Md2 {
    state: [u8; 48],
    checksum: [u8; 16],
    block: [u8; 16],
    filled: usize,
}

/// RFC 1319's substitution table, a permutation of 0..=255 built from the digits of pi.
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

impl Default for Md2 {
    fn default() -> Self {
        Self::new()
    }
}

impl Md2 {
    pub fn new() -> Self {
        Md2 {
            state: [0; 48],
            checksum: [0; 16],
            block: [0; 16],
            filled: 0,
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.filled] = b;
            self.filled += 1;
            if self.filled == 16 {
                let block = self.block;
                self.absorb(&block, true);
                self.filled = 0;
            }
        }
    }

    /// Mixes one 16-byte block into the state (and, for message blocks, into the checksum).
    fn absorb(&mut self, block: &[u8; 16], update_checksum: bool) {
        if update_checksum {
            let mut last = self.checksum[15];
            for (c, &m) in self.checksum.iter_mut().zip(block) {
                *c ^= S[(m ^ last) as usize];
                last = *c;
            }
        }
        let (head, rest) = self.state.split_at_mut(16);
        let (copy, mixed) = rest.split_at_mut(16);
        for (((c, m), &h), &b) in copy.iter_mut().zip(mixed).zip(head.iter()).zip(block) {
            *c = b;
            *m = b ^ h;
        }
        let mut t: u8 = 0;
        for round in 0..18u8 {
            for x in self.state.iter_mut() {
                *x ^= S[t as usize];
                t = *x;
            }
            t = t.wrapping_add(round);
        }
    }

    pub fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.filled) as u8;
        self.update(&vec![pad; pad as usize]);
        let checksum = self.checksum;
        self.absorb(&checksum, false);
        self.state[..16].try_into().expect("16 bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn md2(data: &[u8]) -> String {
        let mut h = Md2::new();
        h.update(data);
        hex(&h.finish())
    }

    /// RFC 1319's test suite (appendix A.5).
    #[test]
    fn md2_rfc1319_known_answers() {
        assert_eq!(md2(b""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2(b"a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2(b"abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2(b"message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(
            md2(b"abcdefghijklmnopqrstuvwxyz"),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
        assert_eq!(
            md2(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
            "da33def2a42df13975352846c30338cd"
        );
        assert_eq!(
            md2(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn md2_streaming_equals_one_shot() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for split in [0, 1, 15, 16, 17, 500, 999] {
            let mut h = Md2::new();
            h.update(&data[..split]);
            h.update(&data[split..]);
            assert_eq!(hex(&h.finish()), md2(&data), "split at {split}");
        }
    }

    /// HMAC by its definition, H((K^opad) || H((K^ipad) || m)), spelled out with one-shot MD2.
    #[test]
    fn hmac_is_the_rfc2104_construction() {
        let key: [u8; 16] = *b"0123456789abcdef";
        let msg = b"what the runtime hashes";
        let inner: Vec<u8> = key
            .iter()
            .map(|b| b ^ 0x36)
            .chain(msg.iter().copied())
            .collect();
        let mut h = Md2::new();
        h.update(&inner);
        let inner_digest = h.finish();
        let outer: Vec<u8> = key.iter().map(|b| b ^ 0x5c).chain(inner_digest).collect();
        let mut h = Md2::new();
        h.update(&outer);
        assert_eq!(hmac_md2(&key, msg), h.finish());
    }

    fn sample(runtime_version: u32) -> Inputs {
        Inputs {
            driver_version: 13000,
            runtime_version,
            pid: 0x0012_3456,
            thread: 0x89ab_cdef,
            runtime_table: 0x7fff_0000_1000,
            integrity_table: 0x7fff_0000_2000,
            function: 0x7fff_0000_3000,
            unix_seconds: 1_764_000_000,
            devices: vec![Device {
                uuid: *b"vramsim-device-0",
                pci_domain: 0,
                pci_bus: 1,
                pci_device: 0,
            }],
        }
    }

    /// Our own known answer for fixed inputs: pins the message layout and the key (the answer
    /// the real runtime accepts is proven by tests/workloads/nvidia/tests/runtime.rs).
    #[test]
    fn hashed_answer_known_value() {
        let a = answer(&sample(12092));
        assert_eq!(
            format!("{:016x}{:016x}", a[0], a[1]),
            "c2512d3e0874b0d24dbe3c70eeab9d01"
        );
    }

    #[test]
    fn every_input_changes_the_hashed_answer() {
        let base = answer(&sample(12092));
        let mut variants = Vec::new();
        let mut v = sample(12092);
        v.driver_version += 10;
        variants.push(v);
        let mut v = sample(12092);
        v.runtime_version = 12082;
        variants.push(v);
        let mut v = sample(12092);
        v.pid += 1;
        variants.push(v);
        let mut v = sample(12092);
        v.thread += 1;
        variants.push(v);
        let mut v = sample(12092);
        v.runtime_table += 8;
        variants.push(v);
        let mut v = sample(12092);
        v.integrity_table += 8;
        variants.push(v);
        let mut v = sample(12092);
        v.function += 8;
        variants.push(v);
        let mut v = sample(12092);
        v.unix_seconds += 1;
        variants.push(v);
        let mut v = sample(12092);
        v.devices[0].uuid[15] ^= 1;
        variants.push(v);
        let mut v = sample(12092);
        v.devices[0].pci_bus = 2;
        variants.push(v);
        let mut v = sample(12092);
        v.devices.push(v.devices[0]);
        variants.push(v);
        for v in variants {
            assert_ne!(answer(&v), base, "{v:?}");
        }
    }

    #[test]
    fn versions_ending_in_0_and_1_take_fixed_answers() {
        assert_eq!(answer(&sample(13020)), FIXED_0);
        assert_eq!(answer(&sample(12091)), FIXED_1);
        let mut other = sample(13020);
        other.pid += 1;
        assert_eq!(answer(&other), FIXED_0);
    }
}
