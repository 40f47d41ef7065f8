"""RMM's memory resources on the GPU: round trips, memGetInfo, then N buffers of 64 MiB.

Usage: rmm_alloc.py RESOURCE [N] [LOG]. RESOURCE: `cuda` (CudaMemoryResource: cudaMalloc per
buffer), `pool` (PoolMemoryResource over CudaMemoryResource), `arena` (ArenaMemoryResource over
CudaMemoryResource, arena sized by RMM from the free memory it is told about) or `async`
(CudaAsyncMemoryResource: cudaMallocFromPoolAsync from a pool RMM creates). With LOG, RMM's
logging adaptor wraps the resource that calls CUDA (CudaMemoryResource under the pool and the
arena, CudaAsyncMemoryResource itself) and writes its CSV to LOG: every row is then one CUDA
allocation or free, which vramshim's trace of the same run must show identically.

Prints `intact 1` when data survived host->device->host and device->device copies, `free F`
and `total T` (rmm.mr.available_device_memory, i.e. cudaMemGetInfo), `buffer PTR` for each
64 MiB buffer, `oom after K - MESSAGE` when RMM raised its out-of-memory error (MemoryError),
the mapped CUDA libraries as `map PATH`, and `done` after every resource was released.
"""
import gc
import sys

import numpy
import rmm

resource = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
log = sys.argv[3] if len(sys.argv) > 3 else None

if resource == "async":
    base = rmm.mr.CudaAsyncMemoryResource()
elif resource in ("cuda", "pool", "arena"):
    base = rmm.mr.CudaMemoryResource()
else:
    sys.exit(f"rmm_alloc.py: unknown resource {resource!r} (cuda, pool, arena, async)")
logged = rmm.mr.LoggingResourceAdaptor(base, log_file_name=log) if log else None
upstream = logged or base
if resource == "pool":
    mr = rmm.mr.PoolMemoryResource(upstream, initial_pool_size=32 << 20)
elif resource == "arena":
    mr = rmm.mr.ArenaMemoryResource(upstream)
else:
    mr = upstream
rmm.mr.set_current_device_resource(mr)

host = numpy.arange(1 << 18, dtype=numpy.uint32)
a = rmm.DeviceBuffer.to_device(host.view(numpy.uint8))
b = a.copy()  # device to device (cudaMemcpyAsync)
ok = all((x.copy_to_host().view(numpy.uint32) == host).all() for x in (a, b))
print("intact", int(ok))
free, total = rmm.mr.available_device_memory()
print("free", free)
print("total", total)
buffers = []
try:
    for _ in range(count):
        buffers.append(rmm.DeviceBuffer(size=64 << 20))
        print("buffer", buffers[-1].ptr, flush=True)
except MemoryError as e:
    print("oom after", len(buffers), "-", str(e).splitlines()[0], flush=True)
for path in sorted({l.split()[-1] for l in open("/proc/self/maps")
                    if "libcud" in l or "vramsim" in l or "libnvidia" in l or "librmm" in l}):
    print("map", path)

# Everything back to CUDA before the log is closed: buffers, then the resource (the pool and
# the arena return their upstream blocks when they go), then the logging adaptor.
del a, b, buffers
rmm.mr.set_current_device_resource(rmm.mr.CudaMemoryResource())
del mr, upstream
gc.collect()
if logged is not None:
    logged.flush()
    del logged
    gc.collect()
print("done")
