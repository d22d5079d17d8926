"""rqcli.malloc: freed buffers stay in the heap instead of being faulted in again (pure, no servers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rqcli.malloc import is_glibc

# The CRT's pattern, reduced: one thread grows response buffers by doubling (realloc) up to 256 KiB,
# touches them, and frees them in bursts with up to 64 alive at once.
CHURN = """
import ctypes, random, resource, sys, threading
if sys.argv[1] == "tuned":
    from rqcli.malloc import keep_freed_memory
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p; libc.malloc.argtypes = [ctypes.c_size_t]
libc.realloc.restype = ctypes.c_void_p; libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def grow():
    size = 1024
    p = libc.malloc(size)
    while size < (256 << 10):
        size *= 2
        p = libc.realloc(p, size)
        ctypes.memset(p, 1, size)
    return p

def work():
    rng, live = random.Random(1), []
    for _ in range(1000):
        live.append(grow())
        if len(live) >= 64 or rng.random() < 0.3:
            for _ in range(rng.randint(1, len(live))):
                libc.free(live.pop(rng.randrange(len(live))))
    for p in live:
        libc.free(p)

def run():
    t = threading.Thread(target=work)
    t.start()
    t.join()

run()  # the first pass grows the heap either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.skipif(not is_glibc(), reason="glibc malloc only")
def test_buffer_churn_stops_faulting_pages_in_again() -> None:
    default, tuned = faults("default"), faults("tuned")
    assert default > 5000, f"the churn no longer reproduces glibc's trimming ({default} faults)"
    assert tuned * 20 < default, f"{tuned} page faults with the thresholds set, {default} without"
