#!/usr/bin/env python3
"""ctypes_alloc.py [BYTES]: a Python program reaching CUDA the way ctypes users (and CuPy-style
loaders) do: ctypes.CDLL("libcudart.so.12") for the runtime, ctypes.CDLL("libcuda.so.1") for the
driver, ctypes.CDLL("libnvidia-ml.so.1") for NVML. Allocates BYTES (default 8 MiB) through each
allocation path, copies a pattern through the device and prints
"ctypes: ok runtime=... free=... total=... nvml_used=...". Exits 1 on any CUDA error."""
import ctypes
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 8 << 20


def check(what, rc):
    if rc != 0:
        print(f"ctypes: {what} failed: {rc}", file=sys.stderr)
        sys.exit(1)


rt = ctypes.CDLL("libcudart.so.12")
drv = ctypes.CDLL("libcuda.so.1")

ver = ctypes.c_int(0)
check("cudaRuntimeGetVersion", rt.cudaRuntimeGetVersion(ctypes.byref(ver)))

# runtime: cudaMalloc, a round trip, cudaMemGetInfo, cudaFree
p = ctypes.c_void_p()
check("cudaMalloc", rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)))
src = (ctypes.c_ubyte * 4096)(*[(i * 7) & 0xFF for i in range(4096)])
dst = (ctypes.c_ubyte * 4096)()
check("cudaMemcpy H2D", rt.cudaMemcpy(p, src, ctypes.c_size_t(4096), 1))
check("cudaMemcpy D2H", rt.cudaMemcpy(dst, p, ctypes.c_size_t(4096), 2))
if bytes(src) != bytes(dst):
    print("ctypes: round trip changed the data", file=sys.stderr)
    sys.exit(1)
free, total = ctypes.c_size_t(), ctypes.c_size_t()
check("cudaMemGetInfo", rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)))

# driver: cuMemAlloc_v2 / cuMemFree_v2 in the runtime's (now current) primary context
d = ctypes.c_uint64()
check("cuMemAlloc_v2", drv.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(n)))
check("cuMemFree_v2", drv.cuMemFree_v2(d))
check("cudaFree", rt.cudaFree(p))

# NVML: memory info as nvidia-smi sees it
used = -1
try:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
except OSError:
    nvml = None
if nvml is not None:

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    h = ctypes.c_void_p()
    m = Memory()
    check("nvmlInit_v2", nvml.nvmlInit_v2())
    check("nvmlDeviceGetHandleByIndex_v2", nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)))
    check("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)))
    used = m.used
    nvml.nvmlShutdown()

print(f"ctypes: ok runtime={ver.value} free={free.value} total={total.value} nvml_used={used}")
