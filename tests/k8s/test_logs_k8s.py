"""Logs on Kubernetes: read from the attempt's pods through the API (the fake API server
serves `pods/<p>/log` with `timestamps`, `sinceTime` and `limitBytes` as a real one does), two ranks
merged, one rank only, resumed from a cursor without repeating or dropping lines that share a
timestamp, followed to the end; through the API and the dispatcher too. Artifacts: not available."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from kubernetes import client

from service.joblogs import AttemptRef, OutputsUnavailable
from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env, LiveServer
from tests.k8s.conftest import IMAGE, NS, make_request
from tests.k8s.fake_apiserver import FakeApiServer
from tests.specs import tiny
from workers.backends import outputs
from workers.backends.base import Handle
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes import logs as k8s_logs
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def _backend(fake: FakeApiServer, ns: str = NS) -> KubernetesBackend:
    return KubernetesBackend(client.ApiClient(client.Configuration(host=fake.host)), namespace=ns,
                             default_image=IMAGE)


def _two_node_job(fake: FakeApiServer, backend: KubernetesBackend) -> tuple[Handle, list[str]]:
    handle = backend.submit(make_request(nodes=2, procs=1, gpus_per_proc=0))
    pods = fake.make_pods("jobsets", NS, handle.name)
    for i, pod in enumerate(pods):
        fake.set_pod(NS, pod, phase="Running", node=f"node-{i}")
    return handle, sorted(pods)  # JobSet pod names sort in node order: <js>-node-0-<i>-...


def _read_all(backend: KubernetesBackend, handle: Handle, cursor: str | None = None,
              **kw: Any) -> tuple[list[Any], str]:
    lines: list[Any] = []
    for _ in range(100):
        chunk = backend.read_logs(handle, rank=kw.get("rank"), cursor=cursor, limit=kw.get("limit", 1000))
        lines += chunk.lines
        cursor = chunk.next_cursor
        if not chunk.lines:
            return lines, cursor
    raise AssertionError("the log never ran out")


def test_pod_logs_merged_by_rank_resumed_exactly_and_finished(fake: FakeApiServer) -> None:
    backend = _backend(fake)
    handle, (pod0, pod1) = _two_node_job(fake, backend)
    assert backend.read_logs(handle, rank=None, cursor=None, limit=10).lines == []  # nothing printed yet
    # three lines of rank 0 within the same microsecond (a timestamp cursor alone would lose or repeat them)
    fake.append_log(NS, pod0, "torchrun: starting\n[rank0]:a\n[rank0]:b\n[rank0]:c", at=T0)
    fake.append_log(NS, pod1, "[rank1]:x\n[rank1]:y", at=T0 + timedelta(milliseconds=3))

    lines, end = _read_all(backend, handle)
    assert [(x.rank, x.line) for x in lines] == [(None, "torchrun: starting"), (0, "a"), (0, "b"), (0, "c"),
                                                 (1, "x"), (1, "y")]
    assert {x.stream for x in lines} == {"output"}
    for i in range(len(lines)):  # from each line's cursor: exactly the lines after it
        assert _read_all(backend, handle, lines[i].cursor)[0] == lines[i + 1:]
    ones, _ = _read_all(backend, handle, rank=1)
    assert [x.line for x in ones] == ["x", "y"]

    # live: what the pods print later comes after the cursor, once; and the end is known
    fake.append_log(NS, pod0, "[rank0]:d", at=T0)  # same timestamp again, later in the log
    fake.append_log(NS, pod1, "[rank1]:z", at=T0 + timedelta(seconds=2))
    more = backend.read_logs(handle, rank=None, cursor=end, limit=100)
    assert [(x.rank, x.line) for x in more.lines] == [(0, "d"), (1, "z")] and not more.finished
    for pod in (pod0, pod1):
        fake.set_pod(NS, pod, phase="Succeeded")
    last = backend.read_logs(handle, rank=None, cursor=more.next_cursor, limit=100)
    assert last.lines == [] and last.finished
    since = [q for m, p, q in fake.requests if p.endswith(f"/pods/{pod0}/log")][-1]
    assert since["timestamps"] == ["true"] and since["sinceTime"] == ["2026-01-02T03:04:05Z"]
    assert since["container"] == ["trainer"]


def test_a_log_larger_than_one_read_comes_whole_in_pieces(fake: FakeApiServer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_logs, "MAX_READ", 300)  # each answer is cut mid-line by limitBytes
    backend = _backend(fake)
    handle, (pod0, _) = _two_node_job(fake, backend)
    want = [f"line {i:03d} " + "x" * 40 for i in range(40)]
    for i, text in enumerate(want):
        fake.append_log(NS, pod0, f"[rank0]:{text}", at=T0 + timedelta(microseconds=i // 3))
    lines, _ = _read_all(backend, handle)
    assert [x.line for x in lines] == want
    sizes = [int(q["limitBytes"][0]) for m, p, q in fake.requests if p.endswith(f"/pods/{pod0}/log")]
    assert len(sizes) > 5 and all(s >= 300 for s in sizes)  # many bounded reads, each 300 new bytes at most


def test_artifacts_are_not_available_and_say_why(fake: FakeApiServer) -> None:
    backend = _backend(fake)
    handle, _ = _two_node_job(fake, backend)
    reader = outputs.BackendOutputs({"kubernetes": backend})
    ref = AttemptRef(backend="kubernetes", name=handle.name, backend_id=handle.backend_id, job_id=7, attempt=1)
    with pytest.raises(OutputsUnavailable, match="not available on Kubernetes"):
        reader.list_artifacts(ref)
    fake.go_down()
    with pytest.raises(OutputsUnavailable) as caught:
        reader.read_logs(ref, rank=None, cursor=None, limit=10)
    assert caught.value.retry  # the API answers 503, not "not available"


def test_through_the_api_two_ranks_merged_and_followed_to_the_end(env: Env, admin: dict[str, str],
                                                                    fake: FakeApiServer) -> None:
    backend = _backend(fake, "training")
    env.app.state.log_reader = outputs.BackendOutputs({"kubernetes": backend})
    env.app.state.settings.logs_poll_s = 0.05
    spec = tiny(resources={"nodes": 2, "gpus_per_node": 1}, backend={"kind": "kubernetes", "namespace": "training"},
                entrypoint={"command": ["python", "train.py"], "image": "example.org/train:1"})
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    dispatcher = Dispatcher(make_sessionmaker(make_engine(env.url)), {"kubernetes": backend},
                            DispatcherConfig(retry_backoff_s=0.0))
    dispatcher.run_once()
    name = f"shardctl-{job_id}-1"
    pods = sorted(fake.make_pods("jobsets", "training", name))
    for i, pod in enumerate(pods):
        fake.set_pod("training", pod, phase="Running", node=f"node-{i}")
        fake.append_log("training", pod, f"[rank{i}]:step 1 on rank {i}")
    dispatcher.run_once()
    r = env.client.get(f"/v1/jobs/{job_id}/logs", headers=admin)
    *rows, end = [json.loads(x) for x in r.text.splitlines()]
    assert [(x["rank"], x["line"]) for x in rows] == [(0, "step 1 on rank 0"), (1, "step 1 on rank 1")]
    assert end["finished"] is False

    def finish() -> None:
        time.sleep(0.5)
        fake.append_log("training", pods[1], "[rank1]:done")
        for pod in pods:
            fake.set_pod("training", pod, phase="Succeeded")
        fake.set_condition("jobsets", "training", name, "Completed", reason="AllJobsCompleted")
        dispatcher.run_once()

    finisher = threading.Thread(target=finish)
    with LiveServer(env.app) as url, httpx.Client(base_url=url, headers=admin, timeout=60) as http:
        finisher.start()
        got: list[tuple[str, Any]] = []
        with http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"},
                         headers={"Last-Event-ID": end["next_cursor"]}) as stream:
            kind = None
            for raw in stream.iter_lines():
                if raw.startswith("event: "):
                    kind = raw[7:]
                elif raw.startswith("data: "):
                    got.append((str(kind), json.loads(raw[6:])))
                    if kind in ("end", "error"):
                        break
        finisher.join()
    assert [(k, d.get("line")) for k, d in got] == [("line", "done"), ("end", None)]
    r = env.client.get(f"/v1/jobs/{job_id}/artifacts", headers=admin)
    assert r.status_code == 409 and "not available on Kubernetes" in r.json()["error"]["message"]
