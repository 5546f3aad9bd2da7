"""Extreme numbers in a spec are 4xx answers, never 5xx or a request that does not end; planning runs
under a time budget on a bounded pool (422 `plan_too_costly` past the budget, 503 `planner_busy`
with Retry-After when every planning thread is busy). Both databases (`db_url`).

What a security review found before this: `global_batch: 2**62` never returned and
40 such requests took /healthz down; `10**400` and `memory_gib: Infinity`, `1e308`, `5e-324` were 500s.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from service.api import submission
from service.api.app import create_app
from service.planner import plan
from service.settings import Settings
from service.spec import (
    MAX_BATCH,
    MAX_FFN_HIDDEN,
    MAX_GBPS,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_MEMORY_GIB,
    MAX_PARAMS,
    MAX_SEQ_LEN,
    MAX_STEPS,
    MAX_TFLOPS,
    MAX_VOCAB,
    MIN_RATE,
    RANGES,
    TrainingSpec,
)
from service.store.db import make_engine
from tests.conftest import BASE_SPEC, deep_merge
from tests.db_fixtures import Env, LiveServer
from tests.specs import tiny

#: Every number a spec holds, as a path into the spec.
NUMBERS: list[tuple[str, ...]] = [
    ("model", "params"), ("model", "layers"), ("model", "hidden"), ("model", "heads"), ("model", "kv_heads"),
    ("model", "ffn_hidden"), ("model", "vocab"), ("model", "seq_len"), ("model", "dropout"),
    ("training", "global_batch"), ("training", "steps"),
    ("resources", "gpu", "memory_gib"), ("resources", "gpu", "peak_tflops", "fp32"),
    ("resources", "gpu", "peak_tflops", "bf16"), ("resources", "gpu", "hbm_gbps"),
    ("resources", "gpus_per_node"), ("resources", "nodes"), ("resources", "gpus"),
    ("resources", "intra_node_gbps"), ("resources", "inter_node_gbps"), ("resources", "cpu_memory_gib"),
    ("layout", "dp"), ("layout", "tp"), ("layout", "pp"), ("layout", "cp"), ("layout", "dp_shard"),
    ("layout", "micro_batch"), ("layout", "virtual_stages"), ("priority",),
]
EXTREMES: list[Any] = [
    0, -1, 1, 2, 3, 7, 8, 64, 65, 10_000, 10_001, 2**16, 2**20, 2**20 + 1, 2**22, 2**24, 2**24 + 1, 10**9,
    2**31, 2**62, 2**63, 2**64, 10**400, -(10**400), 0.0, -0.0, 0.5, 0.999, 1e-3, 9e-4, 5e-324, 1e-308, 1e5,
    1e7, 1e15, 1e16, 1e308, -1e308, math.nan, math.inf, -math.inf, "Infinity", "NaN", "1e400", "12", True, None,
]
VALUES = st.one_of(st.sampled_from(EXTREMES), st.integers(-(2**70), 2**70),
                   st.floats(allow_nan=True, allow_infinity=True))
_INT_MAX = {"layers": MAX_LAYERS, "hidden": MAX_HIDDEN, "heads": MAX_HEADS, "kv_heads": MAX_HEADS,
            "ffn_hidden": MAX_FFN_HIDDEN, "vocab": MAX_VOCAB, "seq_len": MAX_SEQ_LEN, "global_batch": MAX_BATCH,
            "steps": MAX_STEPS, "gpus_per_node": MAX_GPUS_PER_NODE, "nodes": MAX_GPUS, "gpus": MAX_GPUS,
            "dp": MAX_GPUS, "tp": MAX_GPUS, "pp": MAX_GPUS, "cp": MAX_GPUS, "dp_shard": MAX_GPUS,
            "micro_batch": MAX_BATCH, "virtual_stages": MAX_LAYERS, "priority": 1000}
_FLOAT_RANGE = {"params": (1.0, MAX_PARAMS), "dropout": (0.0, 0.999999), "memory_gib": (MIN_RATE, MAX_MEMORY_GIB),
                "fp32": (MIN_RATE, MAX_TFLOPS), "bf16": (MIN_RATE, MAX_TFLOPS), "hbm_gbps": (MIN_RATE, MAX_GBPS),
                "intra_node_gbps": (MIN_RATE, MAX_GBPS), "inter_node_gbps": (MIN_RATE, MAX_GBPS),
                "cpu_memory_gib": (MIN_RATE, MAX_MEMORY_GIB)}


def _edges(path: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """Values at and near the ends of a field's range (most reach the planner)."""
    name = path[-1]
    if name in _INT_MAX:
        high = _INT_MAX[name]
        return st.sampled_from([1, 2, high // 2, high - 1, high]) | st.integers(1, high)
    low, top = _FLOAT_RANGE[name]
    return st.sampled_from([low, top, low * 2, top / 2]) | st.floats(low, top)


CHANGE = st.sampled_from(NUMBERS).flatmap(lambda path: st.tuples(st.just(path), VALUES | _edges(path) | _edges(path)))
H100 = deep_merge(BASE_SPEC, {"name": "extremes"})


def _with(base: dict[str, Any], changes: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """`base` with each path set to its value (an inline GPU replaces a GPU name; `gpus` replaces nodes)."""
    body: dict[str, Any] = json.loads(json.dumps(base))
    for path, value in changes.items():
        if path[:2] == ("resources", "gpu") and isinstance(body["resources"]["gpu"], str):
            body["resources"]["gpu"] = {"name": body["resources"]["gpu"]}
        if path == ("resources", "gpus"):
            body["resources"].pop("nodes", None)
        node = body
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return body


def _post(client: httpx.Client, headers: dict[str, str], body: dict[str, Any],
          route: str = "/v1/plans") -> httpx.Response:
    # NaN and Infinity as JSON tokens (Python's json accepts them; httpx's json= refuses to send them)
    return client.post(route, content=json.dumps(body, allow_nan=True),
                       headers={**headers, "content-type": "application/json"})


def _app_env(url: str, tmp_path: Path, **planner: Any) -> Iterator[Env]:
    from fastapi.testclient import TestClient

    engine = make_engine(url)
    app = create_app(Settings(database_url=url, data_dir=tmp_path, **planner), engine=engine)
    with TestClient(app) as client:
        yield Env(app=app, client=client, url=url)
    engine.dispose()


@pytest.fixture
def budgeted(db_url: str, tmp_path: Path) -> Iterator[Env]:
    """The API with a short planner budget, so that a costly but valid extreme answers quickly."""
    yield from _app_env(db_url, tmp_path, planner_budget_s=0.5)


_unique = itertools.count(7_000_001)


def _fresh(base: dict[str, Any]) -> dict[str, Any]:
    """`base` with a step count no other test plans: the API remembers plans, and these must search."""
    return deep_merge(base, {"training": {"steps": next(_unique)}})


def test_extreme_numbers_are_4xx_and_the_server_keeps_answering(budgeted: Env) -> None:
    admin = budgeted.headers(budgeted.token("admin"))
    seen: list[int] = []
    with LiveServer(budgeted.app) as url, httpx.Client(base_url=url, timeout=60) as client:

        @settings(max_examples=100, deadline=None, database=None, derandomize=True,
                  phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
        @given(base=st.sampled_from([tiny(), H100]),
               changes=st.lists(CHANGE, min_size=1, max_size=4).map(dict))
        @example(base=H100, changes={("training", "global_batch"): 2**62})
        @example(base=H100, changes={("training", "global_batch"): 10**400})
        @example(base=H100, changes={("resources", "gpus_per_node"): 2**62})
        @example(base=H100, changes={("resources", "gpu", "memory_gib"): math.inf})
        @example(base=H100, changes={("resources", "gpu", "memory_gib"): 1e308})
        @example(base=H100, changes={("resources", "gpu", "memory_gib"): 5e-324})
        @example(base=tiny(), changes={("resources", "gpu", "peak_tflops", "fp32"): 5e-324})
        @example(base=tiny(), changes={("resources", "gpu", "hbm_gbps"): 5e-324})
        @example(base=H100, changes={("resources", "intra_node_gbps"): 5e-324, ("resources", "nodes"): 2})
        @example(base=H100, changes={("model", "params"): math.nan})
        # the largest values the bounds allow: answered (a plan, or a 422), within the budget
        @example(base=H100, changes={("training", "global_batch"): 2**24, ("resources", "gpus_per_node"): 64,
                                     ("resources", "nodes"): 2**14})
        @example(base=tiny(), changes={("resources", "gpu", "memory_gib"): 1e-3,
                                       ("resources", "gpu", "peak_tflops", "fp32"): 1e-3,
                                       ("resources", "gpu", "hbm_gbps"): 1e-3, ("resources", "cpu_memory_gib"): 1e-3})
        @example(base=tiny(), changes={("resources", "gpu", "memory_gib"): 1e5,
                                       ("resources", "gpu", "peak_tflops", "fp32"): 1e7,
                                       ("resources", "gpu", "hbm_gbps"): 1e7, ("resources", "intra_node_gbps"): 1e7})
        @example(base=tiny(), changes={("model", "layers"): 10_000, ("model", "hidden"): 2**20,
                                       ("model", "heads"): 2**16, ("model", "seq_len"): 2**24})
        def check(base: dict[str, Any], changes: dict[tuple[str, ...], Any]) -> None:
            response = _post(client, admin, _with(base, changes))
            assert response.status_code < 500, (changes, response.text[:500])
            assert response.status_code == 200 or 400 <= response.status_code < 500
            if response.status_code == 422:
                assert response.json()["error"]["code"] in ("invalid_spec", "plan_too_costly", "validation_error")
            seen.append(response.status_code)
            assert client.get("/healthz").status_code == 200

        check()
        assert client.get("/healthz").json() == {"status": "ok"}
    assert 200 in seen and 422 in seen


@pytest.mark.parametrize("field", sorted(RANGES))
def test_a_number_past_its_range_is_a_422_naming_the_field_and_the_range(env: Env, admin: dict[str, str],
                                                                          field: str) -> None:
    path = tuple("fp32" if part == "*" else part for part in field.split("."))
    for value in (10**400, math.inf, math.nan, -1):
        if field == "priority" and value == -1:
            continue
        r = _post(env.client, admin, _with(tiny(), {path: value}))
        assert r.status_code == 422, (field, value, r.text)
        error = r.json()["error"]
        assert error["code"] == "invalid_spec"
        messages = {f["loc"]: f["message"] for f in error["fields"]}
        name = path[-1]
        matching = [m for loc, m in messages.items() if loc.split(".")[-1] == name and loc.startswith(path[0])]
        assert matching, (field, messages)
        assert f"allowed: {RANGES[field].split(' (')[0]}" in matching[0], (field, matching)


def test_every_number_in_the_json_schema_has_a_finite_range() -> None:
    unbounded: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                if "maximum" not in node and "exclusiveMaximum" not in node:
                    unbounded.append(where)
                if "minimum" not in node and "exclusiveMinimum" not in node:
                    unbounded.append(where)
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(TrainingSpec.model_json_schema(), "$")
    assert unbounded == []
    described = json.dumps(TrainingSpec.model_json_schema())
    assert "1 to 16,777,216" in described and "0.001 to 100,000" in described


def test_a_total_past_the_gpu_bound_names_the_product(env: Env, admin: dict[str, str]) -> None:
    r = _post(env.client, admin, _with(H100, {("resources", "gpus_per_node"): 64, ("resources", "nodes"): 2**20}))
    assert r.status_code == 422
    assert "more than the 1,048,576" in r.json()["error"]["message"]


@pytest.mark.parametrize(("backend", "loc"), [
    ({"kind": "slurm", "time_limit": "9" * 400 + "-00:00:00"}, "backend.time_limit"),
    ({"kind": "slurm", "time_limit": "366-00:00:00"}, "backend.time_limit"),
    ({"kind": "kubernetes", "tolerations": [{"key": "gpu", "tolerationSeconds": 10**400}]},
     "backend.tolerations.0.tolerationSeconds"),
])
def test_backend_numbers_past_their_range_are_422s(env: Env, admin: dict[str, str], backend: dict[str, Any],
                                                  loc: str) -> None:
    r = _post(env.client, admin, tiny(backend=backend))
    assert r.status_code == 422, r.text
    assert [f["loc"] for f in r.json()["error"]["fields"]] == [loc]


@pytest.fixture
def planner_limits(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Sets SHARDCTL_PLANNER_* for the test, before it builds its app (which plans with them)."""

    def set_limits(**limits: object) -> None:
        for name, value in limits.items():
            monkeypatch.setenv(f"SHARDCTL_{name.upper()}", str(value))

    yield set_limits


def test_a_search_past_the_budget_is_a_422_that_says_what_to_pin(db_url: str, tmp_path: Path,
                                                                   planner_limits: Callable[..., None]) -> None:
    planner_limits(planner_budget_s=1e-9)
    for env in _app_env(db_url, tmp_path):
        admin = env.headers(env.token("admin"))
        for route in ("/v1/plans", "/v1/jobs"):
            r = _post(env.client, admin, _fresh(tiny()), route)
            assert r.status_code == 422, (route, r.text)
            error = r.json()["error"]
            assert error["code"] == "plan_too_costly"
            assert "1e-09 s budget" in error["message"] and "pin more of the layout" in error["message"]
            assert error["fields"][0]["loc"] == "layout" and error["details"]["budget_s"] == 1e-9
        assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []  # nothing was queued


def test_a_saturated_planner_is_a_503_with_retry_after(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        planner_limits: Callable[..., None]) -> None:
    started, release = threading.Event(), threading.Event()

    def gated(spec: TrainingSpec, **kw: Any) -> Any:
        started.set()
        assert release.wait(60)
        return plan(spec, **kw)

    monkeypatch.setattr(submission, "plan", gated)
    planner_limits(planner_workers=1, planner_wait_s=0, planner_budget_s=30)
    for env in _app_env(db_url, tmp_path):
        admin = env.headers(env.token("admin"))
        busy, other = _fresh(tiny()), _fresh(tiny())
        with LiveServer(env.app) as url, httpx.Client(base_url=url, timeout=120) as client, \
                ThreadPoolExecutor(max_workers=2) as pool:
            first = pool.submit(_post, client, admin, busy)
            assert started.wait(60)
            r = _post(client, admin, other)  # a different spec finds the one thread busy
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "planner_busy"
            assert r.headers["Retry-After"] == "30"
            r = _post(client, admin, other, "/v1/jobs")
            assert r.status_code == 503 and r.headers["Retry-After"].isdigit()
            same = pool.submit(_post, client, admin, busy)  # the same spec waits for the running search
            assert client.get("/healthz").status_code == 200  # the server answers while planning is saturated
            release.set()
            assert first.result().status_code == 200 and same.result().status_code == 200
            assert first.result().json()["layout"] == same.result().json()["layout"]
            assert _post(client, admin, other).status_code == 200  # the thread is free again
