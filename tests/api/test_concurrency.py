"""50 concurrent submissions with one Idempotency-Key create exactly one job, on both databases."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.db_fixtures import Env
from tests.specs import tiny


def test_fifty_concurrent_submissions_with_one_key_make_one_job(env: Env, live: str) -> None:
    headers = {**env.headers(env.token("admin")), "Idempotency-Key": "same-key"}

    def post(_: int) -> tuple[int, int]:
        with httpx.Client(base_url=live, timeout=60) as client:
            r = client.post("/v1/jobs", json=tiny(), headers=headers)
            return r.status_code, r.json().get("id", -1)

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(post, range(50)))
    statuses = sorted(s for s, _ in results)
    assert statuses.count(201) == 1 and statuses.count(200) == 49, statuses
    assert len({job_id for _, job_id in results}) == 1
    with httpx.Client(base_url=live) as client:
        items = client.get("/v1/jobs", headers=headers).json()["items"]
    assert len(items) == 1
