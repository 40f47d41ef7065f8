//! Deterministic synthetic traces (benchmarks, tests): a training-like stream with weights that
//! live for the whole run, per-step activations and temporaries, call stacks and modules,
//! pool counters, and optionally a cap that refuses the last big request.

use std::io::{self, Write};

use vramshim_trace::{AllocKind, Api, DeviceInfo, Event, Header, MemOp, TraceWriter, codes, flags};

#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub events: u64,
    pub seed: u64,
    pub devices: i32,
    /// Mark allocations pooled and emit Counter records with a reserved figure.
    pub pooled: bool,
    /// End with a cap refusal (and its failed Alloc) for a post-mortem.
    pub refusal: bool,
    /// Scale of the per-step working set (1.0 = default).
    pub scale: f64,
    /// 0: every activation's size is drawn afresh (the original generator). K > 0: each step
    /// replays one of K step shapes (the activation and temporary sizes of a step, drawn once),
    /// as real training repeats a step's sizes from step to step (K = the batch shapes it
    /// cycles through); the times stay random.
    pub step_shapes: u32,
    /// Model the real streams of `shared/traces` as the interposer records them (measured on
    /// their replays, docs/benchmarks.md "Which synthetic trace"): one thread, mostly
    /// short-lived allocations whose blocks come back from a caching allocator (most
    /// addresses are reused, a recent free's most often), step shapes that repeat, and noisy
    /// nanosecond gaps and latencies (the part zstd cannot remove). `step_shapes` (at least 4)
    /// is the number of step shapes. The other modes keep
    /// their original streams for comparison with earlier rounds.
    pub faithful: bool,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            events: 10_000,
            seed: 1,
            devices: 1,
            pooled: true,
            refusal: true,
            scale: 1.0,
            step_shapes: 0,
            faithful: false,
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const SITES: u32 = 48;
const LIB_BASE: u64 = 0x7f10_0000_0000;
const APP_BASE: u64 = 0x5600_0000_0000;

pub fn header(o: &SynthOptions) -> Header {
    Header {
        format_version: 1,
        pid: 4242,
        ppid: 1,
        host: "synth".into(),
        cmdline: vec![
            "python".into(),
            "train.py".into(),
            format!("--seed={}", o.seed),
        ],
        start_wall_ns: 1_763_780_400_000_000_000,
        start_mono_ns: 1_000_000_000,
        devices: (0..o.devices)
            .map(|i| DeviceInfo {
                index: i,
                name: "Simulated H100".into(),
                total_bytes: 80 << 30,
                uuid: None,
            })
            .collect(),
        config: vec![
            ("VRAMSHIM_CAP".into(), "20G".into()),
            ("VRAMSHIM_POOL".into(), "stitch".into()),
        ],
    }
}

/// Writes the synthetic trace; returns the number of events written.
pub fn write<W: Write>(w: W, o: &SynthOptions) -> io::Result<u64> {
    let h = header(o);
    let mut tw = TraceWriter::new(w, &h)?;
    let mut n = 0u64;
    macro_rules! emit {
        ($ev:expr) => {{
            n += 1;
            tw.write(&$ev)
        }};
    }
    emit!(Event::Module {
        base: APP_BASE,
        size: 0x10_0000,
        file_offset: 0,
        path: "/usr/bin/python3.12".into()
    })?;
    emit!(Event::Module {
        base: LIB_BASE,
        size: 0x400_0000,
        file_offset: 0,
        path: "/opt/torch/lib/libtorch_cuda.so".into()
    })?;
    emit!(Event::Module {
        base: LIB_BASE + 0x1000_0000,
        size: 0x10_0000,
        file_offset: 0,
        path: "/usr/lib/libcudart.so.12".into(),
    })?;
    for s in 1..=SITES {
        let frames = vec![
            LIB_BASE + 0x1000_0000 + 0x100 + s as u64,
            LIB_BASE + 0x10_0000 + (s as u64) * 0x1340,
            APP_BASE + 0x2000 + (s as u64 % 7) * 0x88,
        ];
        emit!(Event::Stack { id: s, frames })?;
    }
    let mut rng = Rng(o.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut t: u64 = h.start_mono_ns + 1000;
    let mut next_addr: Vec<u64> = (0..o.devices)
        .map(|d| 0x7e00_0000_0000 + ((d as u64) << 36))
        .collect();
    let mut in_use = vec![0u64; o.devices as usize];
    let mut reserved = vec![0u64; o.devices as usize];
    let mut live_steps: Vec<Vec<(u64, u64, u32)>> = vec![Vec::new(); o.devices as usize];
    let base_op =
        |t: u64, dev: i32, addr: u64, size: u64, stack: u32, tid: u32, pooled: bool| MemOp {
            t_ns: t,
            tid,
            api: if pooled {
                Api::CudaMallocAsync
            } else {
                Api::CudaMalloc
            },
            kind: if pooled {
                AllocKind::Pool
            } else {
                AllocKind::Runtime
            },
            flags: if pooled { flags::POOLED } else { 0 },
            device: dev,
            stream: if pooled { 0x5555_0000 } else { 0 },
            addr,
            size,
            result: codes::CUDA_SUCCESS,
            latency_ns: 900 + (size >> 20) as u32,
            stack,
        };
    let budget = o.events.saturating_sub(n + 4);
    if o.faithful {
        n += faithful(&mut tw, o, &mut rng, t, budget)?;
        tw.finish()?;
        return Ok(n);
    }
    // Weights: 64 allocations per device that live forever.
    let mut written = 0u64;
    for d in 0..o.devices {
        for i in 0..64u64 {
            if written >= budget / 4 {
                break;
            }
            let size = ((i % 8) + 1) << 22;
            let a = next_addr[d as usize];
            next_addr[d as usize] += size.next_multiple_of(2 << 20);
            t += 5_000;
            in_use[d as usize] += size;
            emit!(Event::Alloc(base_op(
                t,
                d,
                a,
                size,
                1 + (i % 4) as u32,
                100,
                o.pooled
            )))?;
            written += 1;
        }
    }
    let step_allocs = (64.0 * o.scale).max(4.0) as u64;
    // Step shapes (step_shapes > 0): per activation, its size and its temporary's size.
    let shapes: Vec<Vec<(u64, Option<u64>)>> = (0..o.step_shapes)
        .map(|_| {
            let k = step_allocs + rng.below(step_allocs / 4 + 1);
            (0..k)
                .map(|_| {
                    let size = (1u64 << (10 + rng.below(13))) + rng.below(4096) * 256;
                    let temp = (rng.below(4) == 0).then(|| 512 + rng.below(1 << 16));
                    (size, temp)
                })
                .collect()
        })
        .collect();
    let mut step = 0u64;
    while written + 4 < budget {
        step += 1;
        let d = (step % o.devices as u64) as i32;
        let di = d as usize;
        // Forward: activations.
        let shape = if shapes.is_empty() {
            None
        } else {
            Some(&shapes[rng.below(shapes.len() as u64) as usize])
        };
        let k = match shape {
            Some(s) => s.len() as u64,
            None => step_allocs + rng.below(step_allocs / 4 + 1),
        };
        for j in 0..k {
            if written + 4 >= budget {
                break;
            }
            let site = 5 + (j % 24) as u32;
            let size = match shape {
                Some(s) => s[j as usize].0,
                None => (1u64 << (10 + rng.below(13))) + rng.below(4096) * 256,
            };
            let a = next_addr[di];
            next_addr[di] += size.next_multiple_of(512);
            t += 2_000 + rng.below(3_000);
            in_use[di] += size;
            live_steps[di].push((a, size, site));
            emit!(Event::Alloc(base_op(
                t,
                d,
                a,
                size,
                site,
                100 + (j % 2) as u32,
                o.pooled
            )))?;
            written += 1;
            // A temporary now and then: allocated and freed at once.
            let temp = match shape {
                Some(s) => s[j as usize].1,
                None if rng.below(4) == 0 && written + 6 < budget => Some(512 + rng.below(1 << 16)),
                None => None,
            };
            if let Some(ts) = temp
                && written + 6 < budget
            {
                let ta = next_addr[di];
                next_addr[di] += ts.next_multiple_of(512);
                t += 500;
                emit!(Event::Alloc(base_op(
                    t,
                    d,
                    ta,
                    ts,
                    30 + (j % 8) as u32,
                    100,
                    o.pooled
                )))?;
                t += 700;
                let mut f = base_op(t, d, ta, ts, 30 + (j % 8) as u32, 100, o.pooled);
                f.api = if o.pooled {
                    Api::CudaFreeAsync
                } else {
                    Api::CudaFree
                };
                emit!(Event::Free(f))?;
                written += 2;
            }
        }
        if o.pooled {
            reserved[di] = reserved[di].max(in_use[di] + (in_use[di] >> 3));
            emit!(Event::Counter {
                t_ns: t,
                device: d,
                live_bytes: in_use[di],
                reserved_bytes: reserved[di],
                cap: 20 << 30
            })?;
            written += 1;
        }
        // Backward: free the activations, most recent first.
        while let Some((a, size, site)) = live_steps[di].pop() {
            if written + 4 >= budget && !live_steps[di].is_empty() && rng.below(2) == 0 {
                // Near the end some stay live (leaks at exit).
                continue;
            }
            t += 1_500 + rng.below(2_000);
            in_use[di] -= size;
            let mut f = base_op(t, d, a, size, site, 100, o.pooled);
            f.api = if o.pooled {
                Api::CudaFreeAsync
            } else {
                Api::CudaFree
            };
            emit!(Event::Free(f))?;
            written += 1;
        }
        // Wrap addresses so the range stays plausible.
        if next_addr[di] > 0x7e00_0000_0000 + ((di as u64) << 36) + (32 << 30) {
            next_addr[di] = 0x7e00_0000_0000 + ((di as u64) << 36) + (2 << 30);
        }
    }
    if o.refusal {
        t += 10_000;
        let size = 24u64 << 30;
        emit!(Event::CapRefusal {
            t_ns: t,
            tid: 100,
            device: 0,
            api: Api::CudaMallocAsync,
            size,
            in_use: in_use[0],
            cap: 20 << 30
        })?;
        let mut a = base_op(t, 0, 0, size, 12, 100, o.pooled);
        a.result = codes::OUT_OF_MEMORY;
        a.flags |= flags::CAP_REFUSED;
        emit!(Event::Alloc(a))?;
    }
    tw.finish()?;
    Ok(n)
}

/// One op of a faithful step shape: allocate block `id` (of `size`, at `site`), or free it.
#[derive(Clone, Copy)]
enum Op {
    Alloc { id: usize, size: u64, site: u32 },
    Free { id: usize },
}

/// A training step as the real streams show it: forward, activations kept for backward with
/// short-lived temporaries around them (most freed within a few calls, as in the replays where
/// ~75% of lifetimes are under 10 us), then backward freeing the activations in reverse, with
/// its own temporaries; a few blocks outlive the step (gradients, optimizer state) and are
/// freed some steps later.
fn faithful_shape(rng: &mut Rng, scale: f64) -> (Vec<Op>, usize) {
    let acts = ((24.0 * scale) as u64).max(4) + rng.below(8);
    // A step uses few distinct sizes (the replays: 0.2-7 new sizes per 100 allocations), some
    // much more often than others: a palette, drawn from with a skew.
    let palette: Vec<u64> = (0..16)
        .map(|_| ((1u64 << (8 + rng.below(15))) + rng.below(64) * 512).next_multiple_of(256))
        .collect();
    let size = |rng: &mut Rng| -> u64 {
        let a = rng.below(16) as usize;
        palette[a.min(rng.below(16) as usize)]
    };
    let mut ops = Vec::new();
    let mut id = 0usize;
    let temps = |ops: &mut Vec<Op>, id: &mut usize, rng: &mut Rng, n: u64| {
        let mut open: Vec<usize> = Vec::new();
        for _ in 0..n {
            let s = size(rng);
            ops.push(Op::Alloc {
                id: *id,
                size: s,
                site: 30 + rng.below(8) as u32,
            });
            open.push(*id);
            *id += 1;
            // Freed soon: after a few more calls, one of the last three.
            while open.len() > 2 || (!open.is_empty() && rng.below(3) == 0) {
                let k = open.len() - 1 - (rng.below(3) as usize).min(open.len() - 1);
                ops.push(Op::Free { id: open.remove(k) });
            }
        }
        for t in open.into_iter().rev() {
            ops.push(Op::Free { id: t });
        }
    };
    let mut kept = Vec::new();
    for j in 0..acts {
        let s = size(rng);
        ops.push(Op::Alloc {
            id,
            size: s,
            site: 5 + (j % 24) as u32,
        });
        kept.push(id);
        id += 1;
        let n = rng.below(7);
        temps(&mut ops, &mut id, rng, n);
    }
    while let Some(a) = kept.pop() {
        let n = rng.below(5);
        temps(&mut ops, &mut id, rng, n);
        ops.push(Op::Free { id: a });
    }
    (ops, id)
}

/// The `faithful` stream (see [`SynthOptions::faithful`]); returns the events written.
fn faithful<W: Write>(
    tw: &mut TraceWriter<W>,
    o: &SynthOptions,
    rng: &mut Rng,
    mut t: u64,
    budget: u64,
) -> io::Result<u64> {
    use std::collections::HashMap;
    let shapes: Vec<(Vec<Op>, usize)> = (0..o.step_shapes.max(4))
        .map(|_| faithful_shape(rng, o.scale))
        .collect();
    let (api, free_api, kind, fl, stream) = if o.pooled {
        (
            Api::CudaMallocAsync,
            Api::CudaFreeAsync,
            AllocKind::Pool,
            flags::POOLED,
            0x5555_0000,
        )
    } else {
        (Api::CudaMalloc, Api::CudaFree, AllocKind::Runtime, 0, 0)
    };
    let op = |t: u64, addr: u64, size: u64, stack: u32, lat: u32| MemOp {
        t_ns: t,
        tid: 100,
        api,
        kind,
        flags: fl,
        device: 0,
        stream,
        addr,
        size,
        result: codes::CUDA_SUCCESS,
        latency_ns: lat,
        stack,
    };
    // Replayed calls: gaps ~150-400 ns between calls, latencies ~300-700 ns with a tail of
    // slow calls (a new block from the driver, a sync); now and then a long gap (kernels).
    let gap = |rng: &mut Rng| -> u64 {
        let g = 90 + rng.below(130) + rng.below(130) + rng.below(130);
        if rng.below(100) == 0 {
            g + 2_000 + rng.below(50_000)
        } else {
            g
        }
    };
    let lat = |rng: &mut Rng, fresh: bool| -> u32 {
        let l = 280 + rng.below(200) + rng.below(200);
        (if fresh || rng.below(25) == 0 {
            l + 500 + rng.below(4_000)
        } else {
            l
        }) as u32
    };
    const BASE: u64 = 0x7f20_0000_0000;
    let mut next_addr = BASE;
    // The caching allocator: freed blocks (address, block size), newest last; an allocation
    // takes the newest block that fits without wasting half of it, so a block freed a few
    // calls ago comes back most often (the replays: ~70% of allocations get one of the last 16
    // frees' addresses, 87-99% a previously freed one once past their first steps). Nothing is
    // released at random: random releases made the address stream far harder to compress than
    // the replays' (record stream 2.2 B/event against their 0.5-1.2).
    let mut cache: Vec<(u64, u64)> = Vec::new();
    let take = |cache: &mut Vec<(u64, u64)>, size: u64| -> Option<u64> {
        let k = cache
            .iter()
            .rev()
            .take(64)
            .position(|&(_, b)| b >= size && b / 2 < size)?;
        Some(cache.remove(cache.len() - 1 - k).0)
    };
    // Block size of every address handed out (a reused block keeps its size).
    let mut block: HashMap<u64, u64> = HashMap::new();
    let mut n = 0u64;
    let mut in_use = 0u64;
    let mut reserved = 0u64;
    // Blocks that outlive their step: (steps left, addr, size, site).
    let mut carried: Vec<(u32, u64, u64, u32)> = Vec::new();
    let mut live: Vec<(u64, u64, u32)> = Vec::new();
    while n + 8 < budget {
        let (ops, ids) = &shapes[rng.below(shapes.len() as u64) as usize];
        live.clear();
        live.resize(*ids, (0, 0, 0));
        for (k, &x) in ops.iter().enumerate() {
            if n + 8 >= budget {
                break;
            }
            t += gap(rng);
            match x {
                Op::Alloc { id, size, site } => {
                    let (addr, fresh) = match take(&mut cache, size) {
                        Some(a) => (a, false),
                        None => {
                            let a = next_addr;
                            next_addr += size.next_multiple_of(512);
                            if next_addr > BASE + (32 << 30) {
                                next_addr = BASE;
                            }
                            block.insert(a, size);
                            if cache.len() > 4096 {
                                cache.drain(..1024);
                            }
                            (a, true)
                        }
                    };
                    let l = lat(rng, fresh);
                    tw.write(&Event::Alloc(op(t, addr, size, site, l)))?;
                    t += l as u64;
                    in_use += size;
                    live[id] = (addr, size, site);
                }
                Op::Free { id } => {
                    let (addr, size, site) = live[id];
                    // One block in 50 is kept for 1-8 steps (a gradient, optimizer state): the
                    // same blocks of a shape every time, as a program does.
                    let h =
                        (k as u64 ^ (site as u64) << 32).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
                    if h.is_multiple_of(50) {
                        carried.push((1 + (h / 50 % 8) as u32, addr, size, site));
                        continue;
                    }
                    let l = lat(rng, false);
                    let mut f = op(t, addr, size, site, l);
                    f.api = free_api;
                    tw.write(&Event::Free(f))?;
                    t += l as u64;
                    in_use -= size;
                    cache.push((addr, block[&addr]));
                }
            }
            n += 1;
        }
        // Blocks carried from earlier steps whose time has come.
        let mut i = 0;
        while i < carried.len() && n + 8 < budget {
            carried[i].0 -= 1;
            if carried[i].0 == 0 {
                let (_, addr, size, site) = carried.swap_remove(i);
                t += gap(rng);
                let l = lat(rng, false);
                let mut f = op(t, addr, size, site, l);
                f.api = free_api;
                tw.write(&Event::Free(f))?;
                t += l as u64;
                in_use -= size;
                cache.push((addr, block[&addr]));
                n += 1;
            } else {
                i += 1;
            }
        }
        if o.pooled {
            reserved = reserved.max(in_use + (in_use >> 3));
            tw.write(&Event::Counter {
                t_ns: t,
                device: 0,
                live_bytes: in_use,
                reserved_bytes: reserved,
                cap: 20 << 30,
            })?;
            n += 1;
        }
    }
    if o.refusal {
        t += 10_000;
        let size = 24u64 << 30;
        tw.write(&Event::CapRefusal {
            t_ns: t,
            tid: 100,
            device: 0,
            api,
            size,
            in_use,
            cap: 20 << 30,
        })?;
        let mut a = op(t, 0, size, 12, 900);
        a.result = codes::OUT_OF_MEMORY;
        a.flags |= flags::CAP_REFUSED;
        tw.write(&Event::Alloc(a))?;
        n += 2;
    }
    Ok(n)
}
