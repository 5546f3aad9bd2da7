"""Fuzz every operation of the OpenAPI schema with schemathesis: no input may cause a 5xx.

Runs on both databases (the `env` fixture), as an admin with a few jobs present so that
generated ids sometimes hit real rows. Event streams are requested as JSON: a live stream of a
running job never ends by design.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.db_fixtures import Env
from tests.specs import tiny

EXAMPLES_PER_OPERATION = 15


def test_no_input_causes_a_server_error(env: Env) -> None:
    admin = env.headers(env.token("admin"))
    for i in range(3):
        env.client.post("/v1/jobs", json=tiny(name=f"seed-{i}"), headers=admin)
    schema = schemathesis.openapi.from_asgi("/openapi.json", env.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 13
    failures: list[tuple[str, str, int, str]] = []

    for operation in operations:
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def fuzz(case: schemathesis.Case) -> None:
            if case.query and "stream" in case.query:
                case.query["stream"] = False
            headers = {k: v for k, v in (case.headers or {}).items()
                       if k.lower() not in ("accept", "last-event-id", "authorization")}
            response = case.call(headers={**headers, **admin})
            if response.status_code >= 500:
                failures.append((case.method, case.formatted_path, response.status_code, response.text[:300]))

        fuzz()
    assert failures == []
