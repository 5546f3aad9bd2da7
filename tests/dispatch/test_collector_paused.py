"""`workers.dispatcher.collector_paused`: the garbage collector's state is restored whatever happens."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from workers.dispatch.reconcile import collector_paused


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    was = gc.isenabled()
    yield None
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_state_before_the_block_is_restored(enabled: bool) -> None:
    gc.enable() if enabled else gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is enabled


def test_nested_blocks_resume_after_the_outer_one_and_an_error_still_resumes() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_overlapping_blocks_in_two_threads_resume_after_the_last() -> None:
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    thread.join(10)
    assert gc.isenabled()
