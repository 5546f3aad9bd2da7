"""The `fake` fixture: a fake Kubernetes API server with the JobSet and Kubeflow APIs, validating every
object against the official schemas (the one fake the project allows). Loaded for every test by the root
conftest's `pytest_plugins`; needs the shared CRD schemas (skips without them, fails under CI)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.schemas import require_crd_schemas


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    """A started fake cluster, taken down after the test."""
    require_crd_schemas()
    server = FakeApiServer().start()
    yield server
    server.go_down()
