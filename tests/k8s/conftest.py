"""Fixtures for the Kubernetes backend tests: the fake API server, a real client pointed at it, a
backend, and launch requests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from pydantic import SecretStr

from service.backend_options import KubernetesOptions
from service.jobenv import JobEnv
from service.planner.result import Plan
from tests.k8s.fake_apiserver import FakeApiServer
from workers.backends.base import LaunchRequest, attempt_name
from workers.backends.kubernetes import KubernetesBackend

NS = "team-a"
IMAGE = "ghcr.io/shardctl/runtime:0.1.0"
JOB_TOKEN = "shc_1_not-a-real-secret"
API_URL = "http://shardctl.shardctl-system:8000"


def make_plan(nodes: int = 2, gpus_per_node: int = 8, gpu: str = "H100-SXM-80GB") -> Plan:
    """A small, fixed plan (not the planner's: the golden files must not move when the planner does)."""
    world = nodes * gpus_per_node
    layout = {"dp": world, "tp": 1, "pp": 1, "cp": 1, "sharding": "fsdp", "dp_shard": world,
              "sequence_parallel": False, "micro_batch": 1, "grad_accum_steps": 1, "activation_checkpointing": "none",
              "pipeline_schedule": None, "virtual_stages": 1, "offload": "none"}
    return Plan.model_validate({
        "name": "t", "fits": True, "model": "llama-tiny", "model_params": 5_000_000, "gpu": gpu,
        "world_size": world, "nodes": nodes, "gpus_per_node": gpus_per_node, "layout": layout,
        "memory": {"params": 1, "grads": 1, "optimizer": 2, "activations": 4, "logits": 1, "comm_buffers": 1,
                   "runtime_overhead": 1, "allocator_margin": 1, "total": 12, "gpu_memory": 1024, "fits": True},
        "time": {"compute_s": 0.5, "recompute_s": 0.0, "comm_exposed_s": 0.0, "bubble_s": 0.0, "optimizer_s": 0.0,
                 "offload_s": 0.0, "step_s": 0.5, "tokens_per_step": 2048, "tokens_per_s": 4096.0,
                 "tokens_per_s_per_gpu": 4096.0 / world, "model_flops_per_step": 1.0, "hardware_flops_per_step": 1.0,
                 "mfu": 0.25, "flop_convention": "6ND", "peak_flops_per_gpu": 1.0, "job_s": 2.5},
        "comm": {"dp": 0, "tp": 0, "pp": 0, "cp": 0},
        "precision": {"compute": "bf16", "params": "fp32", "grads": "fp32", "reduce": "fp32", "loss_scaler": False},
        "rubric": "fits", "explanation": [], "alternatives": [], "rejected": {}, "candidates_evaluated": 1})


def make_request(job_id: int = 7, attempt: int = 1, *, nodes: int = 2, procs: int = 8, gpus_per_proc: int = 1,
                 team: str = "vision", backend: dict[str, Any] | None = None, image: str | None = None,
                 env: dict[str, str] | None = None, command: list[str] | None = None,
                 token: str | None = JOB_TOKEN, api_url: str | None = API_URL) -> LaunchRequest:
    """A launch request as the dispatcher builds it: the job contract (plan, ids, token, URL), the
    spec's entrypoint (`env` is its user environment) and its Kubernetes options (`backend`)."""
    plan = make_plan(nodes, procs, "H100-SXM-80GB" if gpus_per_proc else "cpu")
    job = JobEnv(job_id=job_id, attempt=attempt, plan=plan, api_url=api_url,
                 token=SecretStr(token) if token is not None else None)
    return LaunchRequest(
        job=job, name=attempt_name(job_id, attempt), team=team, nodes=nodes, procs_per_node=procs,
        gpus_per_proc=gpus_per_proc, command=command or ["python", "-m", "workers.runtime"],
        user_env=env or {}, image=image, options=KubernetesOptions.model_validate({"kind": "kubernetes",
                                                                                   **(backend or {})}))


@pytest.fixture
def request_factory() -> Callable[..., LaunchRequest]:
    return make_request


@pytest.fixture
def api_client(fake: FakeApiServer) -> Iterator[Any]:
    config = client.Configuration(host=fake.host)
    with client.ApiClient(config) as api:
        yield api


@pytest.fixture
def backend(api_client: Any) -> KubernetesBackend:
    return KubernetesBackend(api_client, namespace=NS, default_image=IMAGE, queue_for_team={"vision": "vision-queue"})
