"""JAX's CUDA plugin on the GPU: round trips, a compiled step, then N arrays of 64 MiB.

Usage: jax_alloc.py [N]. Run with JAX_PLATFORMS=cuda and XLA_PYTHON_CLIENT_ALLOCATOR=platform.
Prints `devices D` (JAX's devices), `intact 1` when data survived host->device->host copies,
`jit 1` when a jitted function was compiled (by XLA, with ptxas) and launched, `limit L` (XLA's
bytes_limit, which it takes from cuMemGetInfo), `buffer PTR` for each 64 MiB array, `oom after
K - ERROR` when XLA ran out of device memory, `pool_bytes B` and `in_use U` (XLA's
memory_stats: the device memory its allocator holds, and what its arrays use), the mapped CUDA
libraries as `map PATH`, and `done`.

JAX creates its CUDA backend only when a device file of NVIDIA's kernel driver exists
(/dev/nvidia0, /dev/nvidiactl, /dev/dxg); the simulated GPU has none, so that check is
answered here before JAX is imported. Everything after it is JAX's own path.
"""
import sys

import jax._src.hardware_utils as hardware_utils

hardware_utils.has_visible_nvidia_gpu = lambda: True

import jax  # noqa: E402
import numpy  # noqa: E402

count = int(sys.argv[1]) if len(sys.argv) > 1 else 0
print("devices", jax.devices(), flush=True)
host = numpy.arange(1 << 18, dtype=numpy.uint32)
a = jax.device_put(host)
b = jax.device_put(host[::-1].copy())
ok = (numpy.asarray(a) == host).all() and (numpy.asarray(b) == host[::-1]).all()
print("intact", int(ok))
# Kernels do not run on the simulated GPU: the result is not looked at, only that XLA
# compiled the step and launched it.
jax.jit(lambda x, y: x * 2 + y)(a, b).block_until_ready()
print("jit", 1)
stats = jax.devices()[0].memory_stats()
print("limit", stats["bytes_limit"])
arrays = []
try:
    for _ in range(count):
        arrays.append(jax.device_put(numpy.zeros(64 << 20, dtype=numpy.uint8)))
        arrays[-1].block_until_ready()
        print("buffer", arrays[-1].unsafe_buffer_pointer(), flush=True)
except Exception as e:  # XlaRuntimeError / JaxRuntimeError, by version
    print("oom after", len(arrays), "-", type(e).__name__, str(e).splitlines()[0], flush=True)
stats = jax.devices()[0].memory_stats()
print("pool_bytes", stats.get("pool_bytes", 0))
print("in_use", stats["bytes_in_use"])
for path in sorted({l.split()[-1] for l in open("/proc/self/maps")
                    if "libcud" in l or "vramsim" in l or "libnvidia" in l}):
    print("map", path)
print("done", flush=True)
