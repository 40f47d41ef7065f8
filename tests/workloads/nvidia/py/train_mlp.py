"""A small MLP trained with AdamW on the GPU with PyTorch's own bundled CUDA runtime (on
cuda-sim: kernels do not run, so the numbers are meaningless; the allocations are real).

Usage: train_mlp.py [STEPS] [WIDTH] [GROWTH] (the batch, 32, grows GROWTH-fold a step). Prints `segments N` (cudaMalloc calls PyTorch's caching
allocator made, from torch.cuda.memory_stats), `peak N`, `segment ADDRESS SIZE` for each
segment PyTorch holds at the end (torch.cuda.memory_snapshot), the mapped CUDA
libraries as `map PATH`, and `done`. A torch.OutOfMemoryError prints `oom at step K` and exits 3.
"""
import re
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
width = int(sys.argv[2]) if len(sys.argv) > 2 else 256
growth = int(sys.argv[3]) if len(sys.argv) > 3 else 1
torch.manual_seed(0)
step = -1
try:
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, 10)).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        batch = 32 * growth**step
        x = torch.randn(batch, 64, device="cuda")
        y = torch.randint(0, 10, (batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
except torch.OutOfMemoryError as e:
    print(f"oom at step {step}: {str(e).splitlines()[0]}", flush=True)
    sys.exit(3)
stats = torch.cuda.memory_stats()
print("segments", stats.get("segment.all.allocated", 0))
print("reserved", torch.cuda.memory_reserved())
print("peak", torch.cuda.max_memory_allocated())
# Under `vramshim run --pool stitch` PyTorch runs backend:cudaMallocAsync, which keeps no
# segments to list (memory_snapshot refuses it).
if torch.cuda.get_allocator_backend() == "native":
    for seg in torch.cuda.memory_snapshot():
        print("segment", seg["address"], seg["total_size"])
maps = open("/proc/self/maps").read()
for m in sorted(set(re.findall(r"(/\S*/lib(?:cudart|cuda\.so|cublas|vramsim)\S*)", maps))):
    print("map", m)
print("done", flush=True)
