"""CuPy's allocation paths on the GPU: copies in and out, memGetInfo, then N arrays of 64 MiB.

Usage: cupy_alloc.py MODE [N]. MODE: `default` (CuPy's default memory pool), `none`
(`cupy.cuda.set_allocator(None)`: every array is a cudaMalloc of its own) or `async`
(`MemoryAsyncPool`: cudaMallocAsync from the device's pool). Prints `intact 1` when data survived
the round trips, `free F` and `total T` (cudaMemGetInfo), `array PTR` for each 64 MiB array,
`oom after K` when an allocation was refused, the mapped CUDA libraries as `map PATH`, and
`done`.
"""
import sys

import cupy
import numpy

mode = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
if mode == "none":
    cupy.cuda.set_allocator(None)
elif mode == "async":
    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
elif mode != "default":
    sys.exit(f"cupy_alloc.py: unknown mode {mode!r} (default, none, async)")

host = numpy.arange(1 << 18, dtype=numpy.uint32)
a = cupy.asarray(host)
b = cupy.empty_like(a)
b.set(host)
# A device-to-device copy (cudaMemcpy): a.copy() would compile a kernel with NVRTC, which
# needs CUDA's headers (cupy-cuda12x[ctk]) and computes nothing on the simulated GPU.
c = cupy.empty_like(a)
c.data.copy_from_device(a.data, a.nbytes)
ok = all((x.get() == host).all() for x in (a, b, c))
print("intact", int(ok))
free, total = cupy.cuda.runtime.memGetInfo()
print("free", free)
print("total", total)
arrays = []
try:
    for _ in range(count):
        arrays.append(cupy.empty(64 << 20, dtype=cupy.uint8))
        print("array", arrays[-1].data.ptr, flush=True)
except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as e:
    print("oom after", len(arrays), "-", str(e).splitlines()[0])
cupy.cuda.Device().synchronize()
for path in sorted({l.split()[-1] for l in open("/proc/self/maps")
                    if "libcud" in l or "vramsim" in l or "libnvidia" in l}):
    print("map", path)
print("done")
