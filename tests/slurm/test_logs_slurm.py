"""Logs and artifacts on the real local Slurm cluster: a two-node job whose ranks print, read
from submitit's per-node files while it runs and after, resumed from a cursor, one rank only, with
stdout and stderr apart; its output folder listed and read. Skips without SHARDCTL_TEST_SLURM."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from service.joblogs import LogLine
from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env, LiveServer
from tests.slurm.conftest import TERMINAL, launch_request, py, wait_for
from tests.specs import tiny
from workers.backends.base import Handle, RunState
from workers.backends.outputs import BackendOutputs
from workers.backends.slurm import SlurmBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher


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


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_through_the_api_a_slurm_job_is_followed_to_its_end(env: Env, admin: dict[str, str], partition: str,
                                                           tmp_path: Path) -> None:
    """The API over Slurm: a page while it runs, then a live stream from that page's cursor to the end
    (which the store decides: Slurm's reader cannot tell), and the whole read afterwards."""
    backend = SlurmBackend(folder=tmp_path / "slurm", partition=partition)
    env.app.state.log_reader = BackendOutputs({"slurm": backend})
    env.app.state.settings.logs_poll_s = 0.2
    go = tmp_path / "go"
    code = ("import os, time\nr = os.environ['RANK']\nprint(f'before {r}', flush=True)\n"
            f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.1)\n"
            "print(f'after {r}', flush=True)\n")
    spec = tiny(resources={"nodes": 2, "gpus_per_node": 1}, backend={"kind": "slurm", "partition": partition},
                entrypoint={"command": ["python", "-c", code]})
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    dispatcher = Dispatcher(make_sessionmaker(make_engine(env.url)), {"slurm": backend},
                            DispatcherConfig(retry_backoff_s=0.1))
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            dispatcher.run_once()
            time.sleep(0.3)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        deadline, page = time.monotonic() + 120, []
        while {"before 0", "before 1"} - {x.get("line") for x in page}:
            assert time.monotonic() < deadline, page
            r = env.client.get(f"/v1/jobs/{job_id}/logs", headers=admin)
            assert r.status_code == 200, r.text
            page = [json.loads(x) for x in r.text.splitlines()]
            time.sleep(0.3)
        end = page[-1]
        assert end["finished"] is False
        go.write_text("")
        with LiveServer(env.app) as url, httpx.Client(base_url=url, headers=admin, timeout=120) as http, \
                http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"},
                            headers={"Last-Event-ID": end["next_cursor"]}) as stream:
            got, kind = [], None
            for raw in stream.iter_lines():
                if raw.startswith("event: "):
                    kind = raw[7:]
                elif raw.startswith("data: "):
                    got.append((kind, json.loads(raw[6:])))
                    if kind in ("end", "error"):
                        break
        assert got[-1][0] == "end", got[-1]
        after = {(d["rank"], d["line"]) for k, d in got if k == "line" and d["rank"] is not None}
        assert after == {(0, "after 0"), (1, "after 1")}  # only what followed the page, each once
        r = env.client.get(f"/v1/jobs/{job_id}/logs", params={"cursor": got[-1][1]["next_cursor"]}, headers=admin)
        assert r.text.splitlines() == [json.dumps({"next_cursor": got[-1][1]["next_cursor"], "finished": True,
                                                   "attempt": 1}).replace(" ", "")]
    finally:
        go.write_text("")
        stop.set()
        driver.join(timeout=60)
