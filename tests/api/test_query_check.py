"""An API route's query string holds only parameters it takes, each single-valued one once: anything
else is the request gate's 422 naming the parameter, before any shortcut, token check or route. List
parameters repeat; the dashboard's pages and the probes are not checked."""

from __future__ import annotations

import pytest

from tests.db_fixtures import Env
from tests.specs import tiny


@pytest.mark.parametrize("url, name", [
    ("/v1/events?type=&type=", "type"),  # what schemathesis sent for `type=[{}, []]`, once answered 200
    ("/v1/events?type=job.queued&type=job.failed", "type"),
    ("/v1/jobs?team=alpha&team=beta", "team"),  # the list's shortcut declines it; the route refuses it
    ("/v1/jobs?limit=5&status=QUEUED&limit=6", "limit"),
])
def test_a_single_valued_parameter_given_twice_is_refused_by_name(env: Env, admin: dict[str, str], url: str,
                                                                  name: str) -> None:
    r = env.client.get(url, headers=admin)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "validation_error"
    assert error["fields"] == [{"loc": f"query.{name}", "message": f"{name} is given 2 times; it takes one value"}]


def test_a_parameter_the_route_does_not_take_is_refused_by_name(env: Env, admin: dict[str, str]) -> None:
    """`?stauts=FAILED` once listed every job; now it names the typo and what the route takes, on the
    routes with a shortcut (the list, a job, a submission, a heartbeat) as on the others."""
    job = env.client.post("/v1/jobs", json=tiny(name="one"), headers=admin).json()
    listed = env.client.get("/v1/jobs?stauts=FAILED", headers=admin)
    assert listed.status_code == 422, listed.text
    [field] = listed.json()["error"]["fields"]
    assert field["loc"] == "query.stauts" and "it takes" in field["message"] and "status" in field["message"]
    beat = {"kind": "heartbeat", "data": {"step": 1}}
    for method, url, body in (("GET", f"/v1/jobs/{job['id']}?verbose=1", None),
                              ("POST", "/v1/jobs?dry=1", tiny(name="two")),
                              ("POST", f"/v1/jobs/{job['id']}/measurements?x=1", beat),
                              ("GET", "/v1/events?kind=job.queued", None)):
        r = env.client.request(method, url, json=body, headers=admin)
        assert r.status_code == 422, (url, r.text)
        [field] = r.json()["error"]["fields"]
        assert field["loc"].startswith("query.") and "not a query parameter" in field["message"], (url, r.text)
    assert [j["name"] for j in env.client.get("/v1/jobs", headers=admin).json()["items"]] == ["one"]
    assert env.client.get("/v1/jobs?stauts=FAILED").status_code == 422  # before the token check, as NUL is
    assert env.client.get("/healthz?probe=1").status_code == 200  # probes are not the JSON API


def test_list_parameters_still_repeat_and_single_ones_still_answer(env: Env, admin: dict[str, str]) -> None:
    assert env.client.post("/v1/jobs", json=tiny(name="one"), headers=admin).status_code == 201
    both = env.client.get("/v1/jobs?status=QUEUED&status=RUNNING&limit=5", headers=admin)
    assert both.status_code == 200 and [j["name"] for j in both.json()["items"]] == ["one"]
    feed = env.client.get("/v1/events?type=job.queued&limit=5", headers=admin)
    assert feed.status_code == 200 and [e["kind"] for e in feed.json()["items"]] == ["job.queued"]
