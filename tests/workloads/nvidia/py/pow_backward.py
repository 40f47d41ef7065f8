"""One training step whose loss is `.pow(2).mean()`, with PyTorch's own bundled CUDA runtime.

The backward pass runs on PyTorch's autograd thread, where no context is current yet, and the
first kernel launched there lives in a kernel library NVIDIA's runtime has not loaded: the
runtime loads it (cuLibraryLoadData) before making its context current on that thread. A driver
that refuses a library load without a current context fails the step with "CUDA error: invalid
device context".

Prints `grad NORM_IS_FINITE` (kernels do not run on cuda-sim, so only that it is a number), the
mapped CUDA libraries as `map PATH`, and `done`.
"""
import re

import torch

model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
x = torch.randn(64, 1024, device="cuda")
loss = model(x).pow(2).mean()
loss.backward()
torch.cuda.synchronize()
print("grad", model[0].weight.grad is not None)
maps = open("/proc/self/maps").read()
for m in sorted(set(re.findall(r"(/\S*/lib(?:cudart|cuda\.so|cublas|vramsim)\S*)", maps))):
    print("map", m)
print("done", flush=True)
