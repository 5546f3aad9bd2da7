"""Failure classes on Kubernetes (through the fake API server, which validates every object): a
container that cannot start is a launch error at once, an out-of-memory message names the memory,
and the log tail is the program's lines, not torchrun's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s.conftest import NS, make_request
from tests.k8s.fake_apiserver import FakeApiServer
from workers.backends.base import Handle, RunState
from workers.backends.kubernetes import KubernetesBackend

NAME = "shardctl-7-1"


def _submitted(fake: FakeApiServer, backend: KubernetesBackend) -> tuple[Handle, list[str]]:
    handle = backend.submit(make_request())
    return handle, fake.make_pods("jobsets", NS, NAME)


def _waiting(fake: FakeApiServer, pod: str, reason: str, message: str) -> None:
    """The pod scheduled, its container waiting with `reason`, as the kubelet reports it."""
    def apply(obj: dict[str, Any]) -> None:
        obj["spec"]["nodeName"] = "gpu-node-0"
        container = obj["spec"]["containers"][0]
        obj.setdefault("status", {}).update(phase="Pending", containerStatuses=[{
            "name": container["name"], "ready": False, "restartCount": 0, "image": container["image"],
            "imageID": "", "state": {"waiting": {"reason": reason, "message": message}}}])
    fake._update("pods", NS, pod, apply)


@pytest.mark.parametrize("reason,message", [
    ("ImagePullBackOff", 'Back-off pulling image "registry.example/trainer:nope"'),
    ("CreateContainerConfigError", 'secret "shardctl-7-1" not found'),
])
def test_a_container_that_cannot_start_is_a_launch_error(fake: FakeApiServer, backend: KubernetesBackend,
                                                         reason: str, message: str) -> None:
    handle, pods = _submitted(fake, backend)
    _waiting(fake, pods[0], reason, message)
    obs = backend.poll([handle])[NAME]
    assert (obs.state, obs.failure) == (RunState.FAILED, "launch_error")
    assert reason in (obs.reason or "") and message in (obs.reason or "")


def test_an_image_pull_still_being_retried_is_not_yet_a_failure(fake: FakeApiServer,
                                                                backend: KubernetesBackend) -> None:
    handle, pods = _submitted(fake, backend)
    _waiting(fake, pods[0], "ErrImagePull", "rpc error: connection reset")  # the kubelet tries again
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.PENDING and obs.failure is None


TORCHRUN_END = """[rank1]:Traceback (most recent call last):
[rank1]:  File "/app/train.py", line 40, in <module>
[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB
E1201 00:30:45.397000 9274 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
python FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 9280)
============================================================"""


def test_a_cuda_out_of_memory_is_oom_gpu_with_the_programs_own_lines(fake: FakeApiServer,
                                                                      backend: KubernetesBackend) -> None:
    handle, pods = _submitted(fake, backend)
    fake.set_pod(NS, pods[0], phase="Failed", node="gpu-node-0", exit_code=1, termination_message=TORCHRUN_END)
    fake.set_condition("jobsets", NS, NAME, "Failed", reason="FailurePolicyRuleAction")
    obs = backend.poll([handle])[NAME]
    assert (obs.state, obs.failure, obs.exit_code) == (RunState.FAILED, "oom_gpu", 1)
    assert obs.log_tail is not None and "CUDA out of memory" in obs.log_tail
    assert "ChildFailedError" not in obs.log_tail and "Root Cause" not in obs.log_tail
