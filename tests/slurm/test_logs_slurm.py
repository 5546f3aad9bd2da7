"""Logs and artifacts on the real local Slurm cluster (issue 13): a two-node job whose ranks print, read
from submitit's per-node files while it runs and after, resumed from a cursor, one rank only, with
stdout and stderr apart; its output folder listed and read. Skips without SHARDCTL_TEST_SLURM."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from service.joblogs import LogLine
from tests.slurm.conftest import TERMINAL, launch_request, py, wait_for
from workers.backends.base import Handle, RunState
from workers.backends.slurm import SlurmBackend


def _read(backend: SlurmBackend, handle: Handle, cursor: str | None = None,
          rank: int | None = None) -> tuple[list[LogLine], str]:
    lines: list[LogLine] = []
    for _ in range(100):
        chunk = backend.read_logs(handle, rank=rank, cursor=cursor, limit=500)
        lines += chunk.lines
        cursor = chunk.next_cursor
        if not chunk.lines:
            return lines, cursor
    raise AssertionError("the log never ran out")


def test_a_two_node_jobs_ranks_read_live_resumed_and_apart(backend: SlurmBackend, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = ("import os, sys, time\nr = os.environ['RANK']\nprint(f'before {r}', flush=True)\n"
            "print(f'complaint {r}', file=sys.stderr, flush=True)\n"
            f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.1)\n"
            "os.makedirs(os.environ['SHARDCTL_OUT_DIR'], exist_ok=True)\n"
            "open(os.path.join(os.environ['SHARDCTL_OUT_DIR'], f'rank{r}.txt'), 'w').write('done ' + r)\n"
            "print(f'after {r}', flush=True)\n")
    handle = backend.submit(launch_request(py(code), nodes=2))
    try:
        # live: both ranks' first lines arrive while the job still runs
        deadline = time.monotonic() + 120
        seen: list[LogLine] = []
        cursor: str | None = None
        while {("before 0", 0), ("before 1", 1)} - {(x.line, x.rank) for x in seen}:
            assert time.monotonic() < deadline, [x.line for x in seen]
            chunk = backend.read_logs(handle, rank=None, cursor=cursor, limit=500)
            seen += chunk.lines
            cursor = chunk.next_cursor
            time.sleep(0.3)
        assert backend.poll([handle])[handle.name].state == RunState.RUNNING
        go.write_text("")
        assert wait_for(backend, handle, lambda o: o.state in TERMINAL).state == RunState.SUCCEEDED
        rest, end = _read(backend, handle, cursor)
        assert {(x.line, x.rank, x.stream) for x in rest} >= {("after 0", 0, "stdout"), ("after 1", 1, "stdout")}
        assert not {x.line for x in rest} & {x.line for x in seen if x.rank is not None}  # nothing twice

        whole, whole_end = _read(backend, handle)
        # read at once or in pieces: the same lines, each file's in its order (files are not interleaved
        # by time: no file records it), and the same end
        def by_source(lines: list[LogLine]) -> dict[tuple[int | None, str], list[str]]:
            out: dict[tuple[int | None, str], list[str]] = {}
            for x in lines:
                if x.rank is not None:  # unranked lines come from both nodes' files
                    out.setdefault((x.rank, x.stream), []).append(x.line)
            return out

        assert by_source(whole) == by_source(seen + rest) and whole_end == end
        assert Counter(x.line for x in whole) == Counter(x.line for x in seen + rest)
        ranked = [(x.rank, x.stream, x.line) for x in whole if x.rank is not None]
        assert sorted(ranked) == [(0, "stderr", "complaint 0"), (0, "stdout", "after 0"), (0, "stdout", "before 0"),
                                  (1, "stderr", "complaint 1"), (1, "stdout", "after 1"), (1, "stdout", "before 1")]
        assert [x.line for x in whole if x.rank == 0 and x.stream == "stdout"] == ["before 0", "after 0"]
        assert any(x.rank is None for x in whole)  # submitit's and the launcher's own lines, unranked
        i = next(n for n, x in enumerate(whole) if x.line == "before 1")
        assert _read(backend, handle, whole[i].cursor)[0] == whole[i + 1:]
        only, _ = _read(backend, handle, rank=1)
        assert [(x.stream, x.line) for x in only] == [(x.stream, x.line) for x in whole if x.rank == 1]

        files = {a.path: a.size for a in backend.list_artifacts(handle)}
        assert files == {"rank0.txt": 6, "rank1.txt": 6}
        assert backend.read_artifact(handle, "rank1.txt", max_bytes=100) == b"done 1"
    finally:
        go.write_text("")
        backend.cancel(handle)
