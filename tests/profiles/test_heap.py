"""``release_free_heap`` gives freed pages between live heap blocks back to the OS, as the analysis
relies on between ranks."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each 1 MiB block comes from the heap (not its own mmap) and is followed by a small live block, so
# freeing the big ones leaves holes that free() alone never returns: the fragmentation a rank's
# analysis leaves behind.
_CHILD = """
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
from service.profiles.heap import release_free_heap

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

big, small = [], []
for _ in range(64):
    p = libc.malloc(1 << 20)
    ctypes.memset(p, 1, 1 << 20)
    big.append(p)
    small.append(libc.malloc(64))
for p in big:
    libc.free(p)
before = rss()
ran = release_free_heap()
print(json.dumps({"ran": ran, "released": before - rss()}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's; elsewhere it is a no-op")
def test_freed_pages_between_live_blocks_go_back_to_the_os() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["ran"] is True
    assert result["released"] > 48 * 2**20  # of the 64 MiB freed
