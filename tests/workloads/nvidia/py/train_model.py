"""A small real model trained with AdamW on the GPU with PyTorch's own bundled CUDA runtime.

On cuda-sim kernels do not run, so the numbers are meaningless; the allocations, streams and
library calls are real. The transformers models are built from a config object with random
weights: nothing is downloaded.

Usage: train_model.py MODEL [--steps N] [--batch B] [--growth G] [--history] [--empty-cache]
                             [--step-stats] [--callgrind LIB]

  MODEL          mlp | gpt2 (2 layers) | vit (2 layers, 32x32 images) | bert (2 layers)
  --steps N      training steps (default 4)
  --batch B      batch of the first step (default 4; 32 for mlp)
  --growth G     the batch grows G-fold a step (default 1): a way to run out of memory mid-run
  --vary         the batch cycles through 1, 3, 2 and 4 times B (shapes that change between
                 steps, as with variable-length data)
  --history      record PyTorch's allocator history and print every segment it allocated
                 and freed, in order, as `segment_alloc ADDR SIZE` / `segment_free ADDR SIZE`
  --empty-cache  torch.cuda.empty_cache() at the end, so that every segment is freed
  --step-stats   print `step K allocs A frees F device_allocs D syncs S cpu_ns C wall_ns W`
                 per step (deltas of torch.cuda.memory_stats; cpu_ns is the process's CPU time,
                 all threads), and on cuda-sim ` driver_calls N driver_syncs N driver_allocs N
                 driver_frees N launches N` (the driver's own counts, vramsimDriverCalls, of
                 the step's calls up to the script's closing torch.cuda.synchronize(), which is
                 not counted)
  --callgrind LIB  under valgrind's callgrind started with --instr-atstart=no: LIB's
                 cg_start() (counting on) runs as step 2 begins and cg_stop() (counting off,
                 counts written) after the last step, so the counts are the steady-state
                 steps' alone (scripts/bench-models builds LIB)

Prints `model NAME params N`, then after training the allocator's totals from
torch.cuda.memory_stats(): `segments` (cudaMalloc calls: segment.all.allocated),
`segments_freed`, `segment_bytes` (bytes of those calls: reserved_bytes.all.allocated),
`segment_bytes_freed`, `reserved`, `peak_reserved`, `peak` (max_memory_allocated), `syncs`
(num_sync_all_streams), on cuda-sim `device_high_water` (the device's own peak of bytes held:
everything the process holds, libraries' buffers and a pool's cache included), the segments held at the end as `segment ADDR SIZE` (native allocator
only: under backend:cudaMallocAsync there are none to list), the mapped CUDA libraries as
`map PATH`, and `done`. A torch.OutOfMemoryError prints `oom at step K: MESSAGE` and exits 3.
"""
import argparse
import ctypes
import re
import sys
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("model", choices=["mlp", "gpt2", "vit", "bert"])
p.add_argument("--steps", type=int, default=4)
p.add_argument("--batch", type=int, default=None)
p.add_argument("--growth", type=int, default=1)
p.add_argument("--vary", action="store_true")
p.add_argument("--history", action="store_true")
p.add_argument("--empty-cache", action="store_true")
p.add_argument("--step-stats", action="store_true")
p.add_argument("--callgrind", metavar="LIB")
a = p.parse_args()
batch0 = a.batch if a.batch is not None else (32 if a.model == "mlp" else 4)

torch.manual_seed(0)
native = torch.cuda.get_allocator_backend() == "native"
if a.history and native:
    # After CUDA's initialization, so that nothing queued for it (`vramshim run --trace`'s
    # Python hook sets PyTorch's history to its own needs there) overrides this setting.
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(
        "all", context="alloc", stacks="python", max_entries=1_000_000)

# --callgrind: the steps counted (instructions executed by every thread) start here.
CG_FROM = 2
SEQ = 32
VOCAB = 512


def build():
    """The model, and a function that makes one batch of `n` inputs as keyword arguments."""
    if a.model == "mlp":
        m = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def batch(n):
            return {"x": torch.randn(n, 64, device="cuda"),
                    "y": torch.randint(0, 10, (n,), device="cuda")}
        return m, batch
    import transformers
    transformers.logging.set_verbosity_error()
    if a.model == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=SEQ,
                                      vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
        m = transformers.GPT2LMHeadModel(cfg)

        def batch(n):
            ids = torch.randint(0, VOCAB, (n, SEQ), device="cuda")
            return {"input_ids": ids, "labels": ids}
    elif a.model == "bert":
        cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=64,
                                      intermediate_size=128, vocab_size=VOCAB,
                                      max_position_embeddings=SEQ, pad_token_id=0)
        m = transformers.BertForMaskedLM(cfg)

        def batch(n):
            ids = torch.randint(1, VOCAB, (n, SEQ), device="cuda")
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    else:
        cfg = transformers.ViTConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=64,
                                     intermediate_size=128, image_size=32, patch_size=8,
                                     num_labels=10)
        m = transformers.ViTForImageClassification(cfg)

        def batch(n):
            return {"pixel_values": torch.randn(n, 3, 32, 32, device="cuda"),
                    "labels": torch.randint(0, 10, (n,), device="cuda")}
    return m, batch


def loss_of(model, inputs):
    if a.model == "mlp":
        return torch.nn.functional.cross_entropy(model(inputs["x"]), inputs["y"])
    return model(**inputs).loss


def stats():
    s = torch.cuda.memory_stats()
    return {
        "allocs": s.get("allocation.all.allocated", 0),
        "frees": s.get("allocation.all.freed", 0),
        "device_allocs": s.get("num_device_alloc", 0),
        "syncs": s.get("num_sync_all_streams", 0),
    }


class DriverCalls(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64)
                for n in ("calls", "syncs", "allocs", "frees", "launches")]


def driver_counter():
    """cuda-sim's count of the driver calls made so far, or None on another driver."""
    try:
        f = ctypes.CDLL("libcuda.so.1").vramsimDriverCalls
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.POINTER(DriverCalls)]

    def read():
        out = DriverCalls()
        f(ctypes.byref(out))
        return {n: getattr(out, n) for n, _ in DriverCalls._fields_}
    return read


class DeviceStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64)
                for n in ("capacity", "used", "high_water", "refusals", "used_by_self")]


def device_high_water():
    """cuda-sim's own record of the most bytes held at once on device 0, or None."""
    try:
        f = ctypes.CDLL("libcuda.so.1").vramsimDeviceStats
    except (OSError, AttributeError):
        return None
    out = DeviceStats()
    return out.high_water if f(None, 0, ctypes.byref(out)) == 0 else None


step = -1
try:
    model, make_batch = build()
    print("model", a.model, "params", sum(t.numel() for t in model.parameters()), flush=True)
    model = model.to("cuda")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    driver = driver_counter() if a.step_stats else None
    cg = ctypes.CDLL(a.callgrind) if a.callgrind else None
    for step in range(a.steps):
        if cg is not None and step == CG_FROM:
            cg.cg_start()
        before = stats()
        drv0 = driver() if driver else None
        cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
        inputs = make_batch(batch0 * a.growth**step * ((1, 3, 2, 4)[step % 4] if a.vary else 1))
        loss = loss_of(model, inputs)
        opt.zero_grad()
        loss.backward()
        opt.step()
        del inputs, loss
        drv1 = driver() if driver else None
        # The script's own wait for the step's kernels: not one of the step's driver calls.
        torch.cuda.synchronize()
        cpu, wall = time.process_time_ns() - cpu0, time.perf_counter_ns() - wall0
        if a.step_stats:
            after = stats()
            d = {k: after[k] - before[k] for k in after}
            line = (f"step {step} allocs {d['allocs']} frees {d['frees']} "
                    f"device_allocs {d['device_allocs']} syncs {d['syncs']} "
                    f"cpu_ns {cpu} wall_ns {wall}")
            if drv0 is not None:
                line += (f" driver_calls {drv1['calls'] - drv0['calls']}"
                         f" driver_syncs {drv1['syncs'] - drv0['syncs']}"
                         f" driver_allocs {drv1['allocs'] - drv0['allocs']}"
                         f" driver_frees {drv1['frees'] - drv0['frees']}"
                         f" launches {drv1['launches'] - drv0['launches']}")
            print(line, flush=True)
    if cg is not None:
        cg.cg_stop()
except torch.OutOfMemoryError as e:
    print(f"oom at step {step}: {str(e).splitlines()[0]}", flush=True)
    sys.exit(3)

if a.empty_cache:
    del model, opt
    torch.cuda.empty_cache()
s = torch.cuda.memory_stats()
print("segments", s.get("segment.all.allocated", 0))
print("segments_freed", s.get("segment.all.freed", 0))
print("segment_bytes", s.get("reserved_bytes.all.allocated", 0))
print("segment_bytes_freed", s.get("reserved_bytes.all.freed", 0))
print("reserved", torch.cuda.memory_reserved())
print("peak_reserved", torch.cuda.max_memory_reserved())
print("peak", torch.cuda.max_memory_allocated())
print("syncs", s.get("num_sync_all_streams", 0))
hw = device_high_water()
if hw is not None:
    print("device_high_water", hw)
if native:
    for seg in torch.cuda.memory_snapshot():
        print("segment", seg["address"], seg["total_size"])
    if a.history:
        snap = torch.cuda.memory._snapshot()
        for trace in snap["device_traces"]:
            for ev in trace:
                if ev["action"] in ("segment_alloc", "segment_free"):
                    print(ev["action"], ev["addr"], ev["size"])
maps = open("/proc/self/maps").read()
for m in sorted(set(re.findall(r"(/\S*/lib(?:cudart|cuda\.so|cublas|cudnn|vramsim)\S*)", maps))):
    print("map", m)
print("done", flush=True)
