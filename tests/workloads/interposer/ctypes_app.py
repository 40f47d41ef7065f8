"""ctypes_app: a Python program that drives libcudart.so.12 through ctypes (dlopen + dlsym,
as cuda-python, CuPy's loaders and many tools do). Under the preload the interposer's
counters are read through ctypes too (vramshim_counter in the global scope); without it the
checks are skipped, and stdout is the same either way."""
import ctypes
import sys

rt = ctypes.CDLL("libcudart.so.12")
c_void_pp = ctypes.POINTER(ctypes.c_void_p)
rt.cudaMalloc.argtypes = [c_void_pp, ctypes.c_size_t]
rt.cudaMalloc.restype = ctypes.c_int
rt.cudaFree.argtypes = [ctypes.c_void_p]
rt.cudaFree.restype = ctypes.c_int
rt.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
rt.cudaMemGetInfo.restype = ctypes.c_int
rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
rt.cudaMemcpy.restype = ctypes.c_int

try:
    vs = ctypes.CDLL(None).vramshim_counter
    vs.argtypes = [ctypes.c_char_p]
    vs.restype = ctypes.c_longlong
except AttributeError:
    vs = None


def expect_vs(name, want):
    if vs is None:
        return
    got = vs(name.encode())
    if got != want:
        sys.stderr.write(f"counter {name} = {got}, expected {want}\n")
        sys.exit(3)


free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
sizes = [1 << 20, 12345, 3 << 22]
ptrs = []
for s in sizes:
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), s)
    assert rc == 0, rc
    ptrs.append(p)
expect_vs("calls.cudaMalloc", len(sizes))
expect_vs("live_bytes.0", sum(sizes))
expect_vs("live_count.0.runtime", len(sizes))

data = (ctypes.c_ubyte * 64)(*range(64))
back = (ctypes.c_ubyte * 64)()
assert rt.cudaMemcpy(ptrs[1], data, 64, 1) == 0
assert rt.cudaMemcpy(back, ptrs[1], 64, 2) == 0
assert bytes(back) == bytes(data)

for p in ptrs:
    assert rt.cudaFree(p) == 0
print("double free ->", rt.cudaFree(ptrs[0]))
expect_vs("live_bytes.0", 0)
expect_vs("live_entries", 0)
expect_vs("unknown_frees", 1)
print(f"ctypes: ok total={total.value} interposed={'yes' if vs else 'no'}"[: len("ctypes: ok total=") + len(str(total.value))])
