"""cuda.bindings' runtime and driver APIs on the GPU: a round trip, memGetInfo, N buffers of 64 MiB.

Usage: cuda_bindings_alloc.py MODE [N]. MODE, the allocation path every buffer takes:
`malloc` (runtime cudaMalloc/cudaFree), `async` (runtime cudaMallocAsync/cudaFreeAsync on a
stream of its own), `driver` (cuMemAlloc/cuMemFree) or `vmm` (cuMemCreate, cuMemAddressReserve,
cuMemMap, cuMemSetAccess; undone by cuMemUnmap, cuMemRelease, cuMemAddressFree).

Prints `intact 1` when 1 MiB survived host->device->device->host copies through buffers of that
path, `free F` and `total T` (cudaMemGetInfo), `buffer ADDR` for each 64 MiB buffer (the device
address; for `vmm` the mapped address), `alloc ID SIZE` for every allocation made (the device
address, or for `vmm` the cuMemCreate handle, and its size), `oom after K - ERROR` when the path
refused with its out-of-memory code, the mapped CUDA libraries as `map PATH`, `freed` once every
buffer went back, and `done`.
"""
import sys

from cuda.bindings import driver, runtime

mode = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
if mode not in ("malloc", "async", "driver", "vmm"):
    sys.exit(f"cuda_bindings_alloc.py: unknown mode {mode!r} (malloc, async, driver, vmm)")
MIB = 1 << 20
OOM = (runtime.cudaError_t.cudaErrorMemoryAllocation, driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY)


class OutOfMemory(Exception):
    pass


def check(result, what):
    """cuda.bindings returns (error, values...): the values, or exit naming the call."""
    err, *values = result
    if err in OOM:
        raise OutOfMemory(f"{what}: {err.name}")
    if int(err) != 0:
        sys.exit(f"error {what} -> {int(err)} {err.name}")
    return values[0] if len(values) == 1 else values


# Runtime first, as a program does: it creates and sets the primary context the driver calls use.
check(runtime.cudaSetDevice(0), "cudaSetDevice")
check(runtime.cudaFree(0), "cudaFree(0)")
check(driver.cuInit(0), "cuInit")
dev = check(driver.cuDeviceGet(0), "cuDeviceGet")
ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
stream = check(runtime.cudaStreamCreate(), "cudaStreamCreate")

prop = driver.CUmemAllocationProp()
prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
GRAN = check(
    driver.cuMemGetAllocationGranularity(
        prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    ),
    "cuMemGetAllocationGranularity",
)


class Buffer:
    """One allocation of `size` bytes through the mode's path."""

    def __init__(self, size):
        self.size = size
        self.handle = None
        if mode == "malloc":
            self.ptr = int(check(runtime.cudaMalloc(size), "cudaMalloc"))
        elif mode == "async":
            self.ptr = int(check(runtime.cudaMallocAsync(size, stream), "cudaMallocAsync"))
        elif mode == "driver":
            self.ptr = int(check(driver.cuMemAlloc(size), "cuMemAlloc"))
        else:
            rounded = (size + GRAN - 1) // GRAN * GRAN
            self.size = rounded
            handle = check(driver.cuMemCreate(rounded, prop, 0), "cuMemCreate")
            va = check(driver.cuMemAddressReserve(rounded, 0, 0, 0), "cuMemAddressReserve")
            check(driver.cuMemMap(va, rounded, 0, handle, 0), "cuMemMap")
            desc = driver.CUmemAccessDesc()
            desc.location = prop.location
            desc.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            check(driver.cuMemSetAccess(va, rounded, [desc], 1), "cuMemSetAccess")
            self.handle = handle
            self.ptr = int(va)
        print("alloc", int(self.handle) if self.handle is not None else self.ptr, self.size)

    def free(self):
        if mode == "malloc":
            check(runtime.cudaFree(self.ptr), "cudaFree")
        elif mode == "async":
            check(runtime.cudaFreeAsync(self.ptr, stream), "cudaFreeAsync")
        elif mode == "driver":
            check(driver.cuMemFree(self.ptr), "cuMemFree")
        else:
            check(driver.cuMemUnmap(self.ptr, self.size), "cuMemUnmap")
            check(driver.cuMemRelease(self.handle), "cuMemRelease")
            check(driver.cuMemAddressFree(self.ptr, self.size), "cuMemAddressFree")


H2D = runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
D2D = runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice
D2H = runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
data = bytes(range(256)) * (MIB // 256)
back = bytearray(MIB)
x, y = Buffer(MIB), Buffer(MIB)
check(runtime.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
check(runtime.cudaMemcpy(x.ptr, data, MIB, H2D), "cudaMemcpy H2D")
check(driver.cuMemcpyDtoD(y.ptr, x.ptr, MIB), "cuMemcpyDtoD")
check(runtime.cudaMemcpy(back, y.ptr, MIB, D2H), "cudaMemcpy D2H")
print("intact", int(bytes(back) == data))
free, total = check(runtime.cudaMemGetInfo(), "cudaMemGetInfo")
print("free", free)
print("total", total)

buffers = [x, y]
try:
    for _ in range(count):
        buffers.append(Buffer(64 * MIB))
        print("buffer", buffers[-1].ptr, flush=True)
except OutOfMemory as e:
    print("oom after", len(buffers) - 2, "-", e, flush=True)
for b in buffers:
    b.free()
check(runtime.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
check(runtime.cudaStreamDestroy(stream), "cudaStreamDestroy")
print("freed")
for path in sorted({l.split()[-1] for l in open("/proc/self/maps")
                    if "libcud" in l or "vramsim" in l or "libnvidia" in l}):
    print("map", path)
check(driver.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
print("done")
