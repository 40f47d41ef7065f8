"""A backward pass runs out of device memory (on PyTorch's autograd device thread) and the job
exits right away: it must end with its own status (3), never abort.

PyTorch 2.15 carries the Python context (a `contextvars.Context`) to its autograd device
threads in each backward pass's task. The device thread that meets the error wakes the
calling thread, then drops its own reference to the task; when it is descheduled in between,
the calling thread returns first and the device thread drops the last reference later, which
releases the context and so takes the GIL. If the interpreter has started finalizing while it
waits for the GIL, CPython ends the thread inside a C++ destructor that may not throw and the
process aborts ("terminate called without an active exception", exit 134).

On a loaded machine that takes luck; this job arranges it every time, changing only the
scheduling and when the GIL is free:
- all its threads share one CPU, and the autograd device thread runs at SCHED_IDLE during the
  failing pass, so that waking the calling thread preempts it before it drops its reference
  (the calling thread's own drop comes first);
- the calling thread then waits 200 ms in a C call that keeps the GIL (the device thread runs
  meanwhile, drops the task and waits for the GIL), with a switch interval too long for that
  wait to ask for the GIL; at exit the job's own handler gives the device thread back its
  normal policy;
- at finalization a collected object sleeps (GIL released): the waiting device thread gets the
  GIL then, after the interpreter started finalizing.

Prints `forced N` (the autograd device threads it found), `oom in backward: MESSAGE`, exits 3.
"""
import atexit
import ctypes
import gc
import os
import sys
import time

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import torch  # noqa: E402  (after the affinity: PyTorch's threads inherit it)


class SlowExit:
    """Collected at finalization (gc is off until then): releases the GIL for 0.5 s."""

    def __del__(self, sleep=time.sleep):
        sleep(0.5)


gc.disable()
slow_exit = SlowExit()
slow_exit.cycle = slow_exit
del slow_exit


def autograd_threads():
    found = []
    for tid in os.listdir("/proc/self/task"):
        with open("/proc/self/task/%s/comm" % tid) as f:
            if f.read().startswith("pt_autograd"):
                found.append(int(tid))
    return found


def set_policy(tids, policy):
    for tid in tids:
        os.sched_setscheduler(tid, policy, os.sched_param(0))


# A first pass starts the device threads.
small = torch.ones(4, device="cuda", requires_grad=True)
(small * 2).sum().backward()
threads = autograd_threads()
print("forced", len(threads), flush=True)
set_policy(threads, os.SCHED_IDLE)


def back_to_normal():
    # The job's own handlers run before the hook's (registered when torch was imported): from
    # here on the device threads compete for the CPU like any thread, on a loaded machine too.
    # (Leaving SCHED_IDLE needs a RLIMIT_NICE that allows nice 0, or CAP_SYS_NICE.)
    try:
        set_policy(threads, os.SCHED_OTHER)
    except OSError as e:
        print("autograd threads stay at SCHED_IDLE (%s)" % e, file=sys.stderr, flush=True)


atexit.register(back_to_normal)
sys.setswitchinterval(1000.0)

# w and y hold 0.8 of what the cap leaves; the gradient of w needs 0.4 more.
free, _ = torch.cuda.mem_get_info()
n = int(free * 0.4) // 4
w = torch.zeros(n, device="cuda", requires_grad=True)
y = w * 2
try:
    y.sum().backward()
except torch.OutOfMemoryError as e:
    print("oom in backward: %s" % str(e).splitlines()[0], flush=True)
    ctypes.PyDLL(None).usleep(200000)
    sys.exit(3)
print("no oom", flush=True)
