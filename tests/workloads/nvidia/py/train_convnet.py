"""A small conv net trained with SGD on the GPU with PyTorch's bundled CUDA runtime and its
cuDNN (on cuda-sim: kernels do not run, the allocations are real). Usage: train_convnet.py
[STEPS]. Prints `cudnn VERSION`, the mapped cuDNN and CUDA libraries as `map PATH`, and `done`.
"""
import re
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.manual_seed(0)
torch.backends.cudnn.enabled = True
print("cudnn", torch.backends.cudnn.version())
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(steps):
    x = torch.randn(8, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (8,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
maps = open("/proc/self/maps").read()
for m in sorted(set(re.findall(r"(/\S*/lib(?:cudnn|cudart|cuda\.so|vramsim)\S*)", maps))):
    print("map", m)
print("done", flush=True)
