# vramshim's Python startup hook. `vramshim run --trace` puts the directory holding this file
# first on PYTHONPATH (opt out: --no-python-hook or VRAMSHIM_PYTHON_HOOK=0), so Python imports
# it at start-up as `sitecustomize`. It imports nothing heavy and changes nothing until the
# program imports torch.cuda; then it queues, with torch.cuda._lazy_call, a setup that runs
# when the program initializes CUDA: it asks libvramshim.so to attach its trace tracker to
# PyTorch's caching allocator (tensor-level events); the tracker reads the allocating
# thread's Python frames itself. PyTorch's memory history stays as the job sets it (its own
# capture of Python stacks costs about a third of a training step's instructions); only where
# libvramshim.so cannot read this Python's frames is that capture switched on for the tracker.
# At exit, before the interpreter finalizes, it waits (GIL released, at most 5 s) until PyTorch's
# autograd device threads are idle: see _vramshim_settle_autograd. Any other `sitecustomize` on
# the path is loaded after this one, as if this one were not there.
# Nothing here may break the program: every failure is one line on stderr, then nothing.
import sys


def _vramshim_say(msg):
    try:
        sys.stderr.write("vramshim: " + msg + "\n")
    except Exception:
        pass


def _vramshim_setup():
    # Runs inside torch.cuda's lazy initialization, CUDA just started.
    try:
        import atexit
        import ctypes
        import threading
        import time

        import torch

        try:
            lib = ctypes.PyDLL(None)
            attach = lib.vramshim_torch_attach
            drain = lib.vramshim_torch_drain
            # Called without the GIL (CDLL): it blocks until there are stacks to name.
            wait = ctypes.CDLL(None).vramshim_torch_wait
        except (OSError, AttributeError):
            return  # not running under libvramshim.so
        attach.argtypes = [ctypes.c_char_p]
        attach.restype = ctypes.c_int
        drain.argtypes = []
        drain.restype = ctypes.c_int
        wait.argtypes = [ctypes.c_int]
        wait.restype = ctypes.c_int
        backend = torch.cuda.get_allocator_backend()
        if backend != "native":
            # cudaMallocAsync has no trace tracker nor history (PyTorch refuses both), but
            # it asks the driver for every tensor: each is an allocation in the trace.
            _vramshim_say(
                "PyTorch tensor-level events off (PyTorch runs its %s allocator, which has no "
                "trace tracker): each tensor is its own device allocation in the trace; "
                "--stacks N names their Python lines" % backend
            )
            return
        r = attach(str(torch.__version__).encode())
        if r == 2:
            # libvramshim.so cannot read this Python's frames: PyTorch captures them.
            _vramshim_history(torch)
        elif r != 0:
            return  # not tracing, or refused (libvramshim.so said why)
        elif _vramshim_job_history(torch):
            _vramshim_say(
                "the job records PyTorch's memory history itself: its settings are kept "
                "(tensor events carry the Python stacks it captures, else their own)"
            )

        def loop():
            # Wakes only when PyTorch captured a stack that is not named yet (never while
            # libvramshim.so names every stack itself), at most 10 times a second.
            while True:
                wait(-1)
                drain()
                time.sleep(0.1)

        threading.Thread(target=loop, name="vramshim-drain", daemon=True).start()
        atexit.register(drain)
    except Exception as e:
        _vramshim_say("PyTorch tensor-level events off (%s: %s)" % (type(e).__name__, e))


def _vramshim_job_history(torch):
    try:
        return bool(torch._C._cuda_isHistoryEnabled())
    except Exception:
        return False


def _vramshim_history(torch):
    # PyTorch's capture of each allocation's Python stack, which the tensor events carry. The
    # job's own use of PyTorch's memory history comes first: history it turned on before CUDA
    # started is left as the job set it (it captures the stacks the tracker reads unless the
    # job asked for none); history it turns off later is turned back on for the tracker alone
    # (a one-entry ring), so its tensors keep their Python lines.
    memory = torch.cuda.memory
    ours = dict(context="alloc", stacks="python", max_entries=1)

    def mine():
        try:
            memory._record_memory_history("state", **ours)
            return True
        except Exception as e:
            _vramshim_say(
                "PyTorch's Python stacks could not be switched on (%s: %s): tensor events "
                "carry no Python lines" % (type(e).__name__, e)
            )
            return False

    try:
        already = bool(torch._C._cuda_isHistoryEnabled())
    except Exception:
        already = False
    if already:
        _vramshim_say(
            "the job records PyTorch's memory history itself: its settings are kept (tensor "
            "events carry the Python stacks they capture)"
        )
    elif not mine():
        return
    job_call = memory._record_memory_history
    original = getattr(job_call, "__wrapped__", job_call)

    def _record_memory_history(enabled="all", *args, **kwargs):
        r = original(enabled, *args, **kwargs)
        if enabled is None or enabled is False:
            try:
                original("state", **ours)
            except Exception:
                pass
        return r

    _record_memory_history.__wrapped__ = original
    _record_memory_history.__doc__ = original.__doc__
    try:
        _record_memory_history.__signature__ = original.__signature__
    except AttributeError:
        pass
    memory._record_memory_history = _record_memory_history


# The futex system call's number, by machine (`/proc/<tid>/syscall` names calls by number).
_VRAMSHIM_FUTEX = {"x86_64": 202, "aarch64": 98}
# The futex operation of a condition variable's wait (flags masked out): FUTEX_WAIT_BITSET in
# glibc, FUTEX_WAIT in musl. Only that one counts as idle: glibc also waits on a contended mutex
# with FUTEX_WAIT and no time limit, and a device thread blocked on a mutex is not done.
def _vramshim_futex_waits():
    try:
        import os

        if (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return (9,)
    except (ValueError, OSError, AttributeError):
        pass
    return (0, 9)
# Longest wait at exit for PyTorch's autograd device threads (seconds).
_VRAMSHIM_SETTLE_S = 5.0


def _vramshim_settle_autograd(pid):
    # PyTorch (2.15) carries the Python context (a `contextvars.Context`) to its autograd
    # device threads in each backward pass's graph task. The device thread that finishes a
    # pass wakes the calling thread, then drops its own reference to the task; when it is
    # descheduled in between (a loaded machine), the calling thread returns first and the
    # device thread drops the last reference later. Releasing the context takes the GIL; a
    # device thread still waiting for it when the interpreter starts finalizing is ended by
    # CPython from inside a C++ destructor that may not throw, and the process aborts
    # ("terminate called without an active exception", exit 134) instead of exiting with the
    # job's status. A job that exits right after backward() (an out-of-memory error in
    # backward, then sys.exit) can meet that on a loaded machine.
    # This runs at exit, before finalization starts: it sleeps (the GIL released, so a device
    # thread waiting for it gets it) until every autograd device thread is idle in its
    # queue's wait, holding no task, or until _VRAMSHIM_SETTLE_S has passed.
    try:
        import os
        import time

        if os.getpid() != pid:
            return  # a forked child: PyTorch's threads are not its own
        if os.environ.get("VRAMSHIM_PYTHON_HOOK_FAULT", "").strip() == "no-settle":
            return
        tids = _vramshim_autograd_threads()
        if not tids:
            return
        futex = _VRAMSHIM_FUTEX.get(os.uname().machine)
        waits = _vramshim_futex_waits()
        deadline = time.monotonic() + _VRAMSHIM_SETTLE_S
        last = {}
        while True:
            settled = True
            for tid in tids:
                now = _vramshim_thread_idle(tid, futex, waits)
                before = last.get(tid)
                last[tid] = now
                # Gone, or idle now and at the previous look with no switch in between.
                if now is not None and not (now[0] and before == now):
                    settled = False
            if settled or time.monotonic() >= deadline:
                return
            time.sleep(0.005)
    except Exception:
        pass


def _vramshim_autograd_threads():
    # PyTorch names its autograd device threads (and their reentrant pool) pt_autograd_<N>.
    import os

    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                if f.read().startswith("pt_autograd"):
                    found.append(tid)
        except OSError:
            pass
    return found


def _vramshim_thread_idle(tid, futex, waits):
    # (idle, context switches) of one thread, None when it is gone. Idle: asleep, and where
    # the system call it sleeps in can be read, in a futex wait with no time limit (an
    # autograd thread waiting for work; its wait for the GIL has a time limit, so it is never
    # taken for idle).
    base = "/proc/self/task/%s/" % tid
    try:
        with open(base + "status") as f:
            fields = dict(
                line.split(":", 1) for line in f.read().splitlines() if ":" in line
            )
    except OSError:
        return None
    try:
        state = fields["State"].split()[0]
        switches = int(fields["voluntary_ctxt_switches"]) + int(
            fields["nonvoluntary_ctxt_switches"]
        )
    except (KeyError, IndexError, ValueError):
        return (False, 0)
    if state != "S":
        return (False, switches)
    if futex is not None:
        try:
            with open(base + "syscall") as f:
                words = f.read().split()
        except OSError:
            words = []
        # "NR ARG0 .. ARG5 SP PC" while in a call ("running", or "-1 SP PC" otherwise).
        if len(words) >= 5:
            try:
                nr, op, timeout = int(words[0]), int(words[2], 16), int(words[4], 16)
            except ValueError:
                return (False, switches)
            if nr != futex or op & 0x7F not in waits or timeout != 0:
                return (False, switches)
        elif words:
            return (False, switches)
    return (True, switches)


class _VramshimLoader(object):
    """torch.cuda's own loader, then the setup queued for CUDA's initialization."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            module._lazy_call(_vramshim_setup)
        except Exception as e:
            _vramshim_say("PyTorch tensor-level events off (%s: %s)" % (type(e).__name__, e))
        try:
            import atexit
            import os

            # Registered while torch imports, before the job's own handlers: atexit runs
            # handlers last-registered first, so this one runs after them.
            atexit.register(_vramshim_settle_autograd, os.getpid())
        except Exception:
            pass

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _VramshimFinder(object):
    """Waits for `import torch.cuda` (once), and wraps its loader."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.cuda":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
            if spec is not None and spec.loader is not None:
                spec.loader = _VramshimLoader(spec.loader)
            return spec
        except Exception as e:
            _vramshim_say("PyTorch tensor-level events off (%s: %s)" % (type(e).__name__, e))
            return None


def _vramshim_chain():
    # The next `sitecustomize` on the path (a virtual environment's, the distribution's).
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = mod
    spec.loader.exec_module(mod)


if sys.version_info >= (3, 8) and "torch.cuda" not in sys.modules:
    sys.meta_path.insert(0, _VramshimFinder())
_vramshim_chain()
