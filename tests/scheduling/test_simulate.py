"""The trace simulator (and `shardctl simulate`): fair shares, no starvation, reclaim, determinism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from service.cli.main import app
from service.scheduling.simulate import Trace, simulate

GPU = "H100-SXM-80GB"


def trace(teams: dict[str, dict[str, Any]], jobs: list[dict[str, Any]], gpus: int = 8,
          **settings: Any) -> Trace:
    return Trace.model_validate({"pools": [{"name": "gpu", "backend": "local", "gpu": GPU, "gpus": gpus}],
                                 "teams": teams, "settings": settings, "jobs": jobs})


def borrowers(*names: str, weights: tuple[float, ...] = ()) -> dict[str, dict[str, Any]]:
    return {n: {"weight": weights[i] if weights else 1.0, "flavors": {GPU: {"nominal": 0}}}
            for i, n in enumerate(names)}


def saturating_121() -> Trace:
    # every team keeps a backlog for the whole 20 h horizon; job shapes differ per team
    return trace(borrowers("a", "b", "c", weights=(1, 2, 1)), [
        {"team": "a", "gpus": 1, "duration_s": 3600, "count": 100},
        {"team": "b", "gpus": 2, "duration_s": 1800, "count": 100},
        {"team": "c", "gpus": 1, "duration_s": 5400, "count": 100},
    ], horizon_s=20 * 3600)


def test_weights_1_2_1_saturating_a_pool_converge_to_25_50_25_gpu_hours() -> None:
    result = simulate(saturating_121())
    shares = {t: r.share * 100 for t, r in result.teams.items()}
    assert abs(shares["a"] - 25) <= 5 and abs(shares["b"] - 50) <= 5 and abs(shares["c"] - 25) <= 5, shares
    assert all(r.jobs > r.finished for r in result.teams.values())  # saturated to the end: backlog left


def test_the_same_trace_gives_the_same_schedule_twice() -> None:
    first, second = simulate(saturating_121(), keep_log=True), simulate(saturating_121(), keep_log=True)
    assert first.digest == second.digest and first.log == second.log
    changed = saturating_121()
    changed.jobs[0] = changed.jobs[0].model_copy(update={"duration_s": 3601})
    assert simulate(changed).digest != first.digest


def _stream(reserve_after_s: float) -> Trace:
    # two teams keep 6 of 8 GPUs busy with 1-GPU jobs; a third needs all 8 now and then
    return trace(borrowers("big", "s1", "s2"), [
        {"team": "s1", "gpus": 1, "duration_s": 1800, "count": 250, "every_s": 600},
        {"team": "s2", "gpus": 1, "duration_s": 1800, "count": 250, "every_s": 600, "submit_s": 300},
        {"team": "big", "gpus": 8, "duration_s": 1800, "count": 5, "every_s": 14400, "submit_s": 60},
    ], reserve_after_s=reserve_after_s)


def test_no_job_waits_forever_a_blocked_head_job_reserves_after_reserve_after_s() -> None:
    # bound: reserve_after_s, then at most the longest running job (1800 s) to drain its reservation,
    # and one more for jobs admitted in the same instant ahead of it
    bound = 900 + 2 * 1800
    result = simulate(_stream(900))
    assert result.never_started == []
    waits = [result.first_start[i] - result.submitted[i] for i in result.submitted]
    assert max(waits) <= bound
    # without the reservation, the 8-GPU jobs starve behind the stream of small ones
    starved = simulate(_stream(10**9))
    assert starved.teams["big"].max_wait_s > 10 * bound


def test_a_team_reclaims_its_nominal_quota_and_the_victims_lose_work_since_their_checkpoint() -> None:
    teams = {"a": {"flavors": {GPU: {"nominal": 4}}}, "b": {"flavors": {GPU: {"nominal": 4}}}}
    t = trace(teams, [{"team": "b", "gpus": 1, "duration_s": 7200, "count": 8},
                      {"team": "a", "gpus": 2, "duration_s": 600, "count": 2, "submit_s": 1000}],
              checkpoint_every_s=600, preempt_grace_s=30, min_runtime_s=600)
    result = simulate(t, keep_log=True)
    a_jobs = [i for i in result.submitted if result.submitted[i] == 1000]
    assert sorted(result.first_start[i] for i in a_jobs) == [1030, 1060]  # one preemptor per pool per cycle
    b = result.teams["b"]
    assert b.preempted == 4 and b.finished == 8
    assert b.lost_gpu_seconds == 2 * (1030 - 600) + 2 * (1060 - 600)  # since the checkpoint at 600 s
    assert result.never_started == []


def test_shardctl_simulate_prints_shares_and_the_digest(tmp_path: Path) -> None:
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(saturating_121().model_dump(mode="json", exclude_none=True)))
    out = CliRunner().invoke(app, ["simulate", str(path)])
    assert out.exit_code == 0, out.output
    assert "schedule digest: " + simulate(saturating_121()).digest in out.output
    as_json = CliRunner().invoke(app, ["simulate", str(path), "--json"])
    assert as_json.exit_code == 0
    assert set(json.loads(as_json.output)["teams"]) == {"a", "b", "c"}


def test_shardctl_simulate_names_the_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "trace.yaml"
    path.write_text("pools: [{name: gpu, backend: local, gpu: cpu, gpus: 2}]\n"
                    "jobs: [{team: a, gpus: 1, duration_s: -5}]\n")
    out = CliRunner().invoke(app, ["simulate", str(path)])
    assert out.exit_code == 1
    assert "jobs.0.duration_s" in out.output
    missing = CliRunner().invoke(app, ["simulate", str(tmp_path / "absent.yaml")])
    assert missing.exit_code == 3


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    kinds = ["H100-SXM-80GB", "L40S-48GB"]
    pools: list[dict[str, Any]] = [
             {"name": f"p{i}", "backend": "local", "gpu": kinds[i % 2], "gpus": draw(st.integers(1, 8)),
              "preemption": draw(st.sampled_from(["never", "reclaim", "lower_priority"]))}
             for i in range(draw(st.integers(1, 3)))]
    used = sorted({str(p["gpu"]) for p in pools})
    teams = {t: {"weight": draw(st.sampled_from([0, 1, 2])), "group": draw(st.sampled_from([None, "x", "y"])),
                 "flavors": {k: {"nominal": draw(st.integers(0, 4)),
                                 "borrowing_limit": draw(st.one_of(st.none(), st.integers(0, 4))),
                                 "lending_limit": draw(st.one_of(st.none(), st.integers(0, 4)))}
                             for k in used if draw(st.booleans())}}
             for t in ["a", "b", "c"][:draw(st.integers(1, 3))]}
    jobs = [{"team": draw(st.sampled_from(list(teams))), "gpus": draw(st.integers(1, 8)),
             "gpu": draw(st.sampled_from(used)), "duration_s": draw(st.integers(100, 5000)),
             "submit_s": draw(st.integers(0, 5000)), "priority": draw(st.integers(0, 2)),
             "count": draw(st.integers(1, 5)), "every_s": draw(st.integers(0, 500))}
            for _ in range(draw(st.integers(1, 8)))]
    return Trace.model_validate({"pools": pools, "teams": teams, "jobs": jobs, "settings": {
        "min_runtime_s": draw(st.sampled_from([0, 300])), "reserve_after_s": draw(st.sampled_from([0, 900])),
        "preempt_grace_s": draw(st.sampled_from([0, 30])), "checkpoint_every_s": 200}})


@settings(max_examples=80, deadline=None)
@given(traces())
def test_any_trace_ends_loses_no_job_and_replays_identically(t: Trace) -> None:
    first = simulate(t, keep_log=True)
    again = simulate(t, keep_log=True)
    assert first.log == again.log and first.digest == again.digest
    finished = sum(r.finished for r in first.teams.values())
    assert finished + len(first.never_started) == len(first.submitted)  # no started job is lost
    assert all(r.share >= 0 for r in first.teams.values())
