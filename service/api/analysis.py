"""Trace analyses run off the request threads, on a bounded pool: a few at a time, a short queue, and
a clear 503 beyond it, so uploads can neither pile up threads nor hold unbounded memory.

Memory is bounded per analysis by `SHARDCTL_MAX_TRACE_EVENTS` (complete events kept per rank, ranks
analysed one after another) and overall by `SHARDCTL_PROFILE_WORKERS` analyses at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class AnalysisBusy(RuntimeError):
    """Every worker is busy and the queue is full: try again later."""


class AnalysisPool:
    """`workers` analyses at once and at most `queue` more waiting; `submit` refuses beyond that."""

    def __init__(self, workers: int, queue: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="profile-analysis")
        self._slots = threading.BoundedSemaphore(workers + queue)

    def submit(self, work: Callable[[], None]) -> None:
        """Run `work` on the pool; `AnalysisBusy` at once (nothing queued) when it is full."""
        if not self._slots.acquire(blocking=False):
            raise AnalysisBusy("every trace analysis slot is taken")

        def run() -> None:
            try:
                work()
            finally:
                self._slots.release()

        self._executor.submit(run)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
