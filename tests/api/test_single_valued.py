"""A query parameter that takes one value, given twice, is a 422 naming it; list parameters repeat."""

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


def test_list_parameters_still_repeat_and_single_ones_still_answer(env: Env, admin: dict[str, str]) -> None:
    assert env.client.post("/v1/jobs", json=tiny(name="one"), headers=admin).status_code == 201
    both = env.client.get("/v1/jobs?status=QUEUED&status=RUNNING&limit=5", headers=admin)
    assert both.status_code == 200 and [j["name"] for j in both.json()["items"]] == ["one"]
    feed = env.client.get("/v1/events?type=job.queued&limit=5", headers=admin)
    assert feed.status_code == 200 and [e["kind"] for e in feed.json()["items"]] == ["job.queued"]
