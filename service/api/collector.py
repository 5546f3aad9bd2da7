"""The cyclic garbage collector in an API server process.

A server process holds a few hundred thousand container objects that live as long as it does: the
imported modules, their classes and functions, the app, its routes and models. Every full (oldest
generation) pass of the collector walks all of them; measured in a `--workers 2` server under
`benchmarks/api_load.py`, those passes took 80 to 200 ms each, every ~70,000 allocations, and a
worker answers nothing meanwhile, so they were the reads' loaded p99. Moving those objects to the
collector's permanent generation (`gc.freeze`) once the app starts leaves a full pass only what was
made since.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_frozen = False


def freeze_startup_objects() -> None:
    """The first call in a process collects what is garbage now, then moves every object still alive
    to the permanent generation, which the collector no longer walks. Later calls (a test session
    starts many apps) do nothing, so what later apps leave behind stays collectable. Frozen objects
    are still freed by reference counting; a reference cycle among them that becomes garbage is not
    reclaimed, which for objects made before the first app started (the imports, that app) is the
    process's lifetime anyway."""
    global _frozen
    with _lock:
        if _frozen:
            return
        _frozen = True
    gc.collect()
    gc.freeze()
