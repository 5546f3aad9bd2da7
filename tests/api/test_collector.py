"""The API server's collector: what is alive when the first app starts is frozen, once per process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A fresh interpreter: this test session has started apps already, so it froze long ago.
SERVE_TWO_APPS = """
import gc, sys, weakref
from fastapi.testclient import TestClient
from service.api.app import create_app
from service.settings import Settings
from service.store import migrate

folder = sys.argv[1]
url = f"sqlite:///{folder}/shardctl.db"
migrate.upgrade(url)
before = gc.get_freeze_count()
with TestClient(create_app(Settings(database_url=url, data_dir=folder))) as client:
    assert client.get("/healthz").status_code == 200
first = gc.get_freeze_count()


class Node:
    pass


cycle = Node()
cycle.me = cycle
alive = weakref.ref(cycle)
with TestClient(create_app(Settings(database_url=url, data_dir=folder))) as client:
    assert client.get("/healthz").status_code == 200
    during = gc.get_freeze_count()
    del cycle  # alive across the second startup: a second freeze would have made it permanent
gc.collect()
print(before, first, during, alive() is None)
"""


def test_the_first_app_started_freezes_what_is_alive_and_later_garbage_stays_collectable(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SERVE_TWO_APPS, str(tmp_path)], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split()
    before, first, during, collected = int(out[0]), int(out[1]), int(out[2]), out[3] == "True"
    assert before == 0
    assert first > 50_000  # the imports and the app: what a full pass no longer walks
    # Only gc.freeze adds to the permanent generation; a frozen object that reference counting frees
    # (the first app's, once its client closed) leaves it, so the count may only have fallen.
    assert during <= first  # the second app, running, froze nothing more
    assert collected  # so a reference cycle alive at the second startup, dropped after, is reclaimed
