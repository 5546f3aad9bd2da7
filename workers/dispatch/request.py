"""The launch request of an attempt (`build_request`, the one builder every backend gets) and the preview of
`POST /v1/plans` (`launch_preview`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from service.jobenv import JobEnv
from service.planner.result import Plan
from service.redaction import redact_strings
from service.scheduling.kueue_names import KueueQueue
from service.spec import TrainingSpec
from workers.backends.base import Backend, LaunchRequest, SubmissionRefused, attempt_name, runtime_command

if TYPE_CHECKING:
    from service.api.app import LaunchPreview


def build_request(job_id: int, number: int, *, plan: Plan, spec: TrainingSpec, team: str,
                  token: str | None, api_url: str | None, kueue: KueueQueue | None = None) -> LaunchRequest:
    """The launch request for attempt `number` of a job: the world from the plan, the entrypoint from
    the spec (the built-in runtime when absent), and the job contract every rank gets. `kueue`: the
    LocalQueue and priority class when the job's pool is Kueue-managed (`kueue_queue_for(job.pool)`)."""
    layout = plan.layout
    nodes, per_node = plan.nodes, plan.gpus_per_node
    if nodes * per_node != layout.world_size:
        per_node = max(1, layout.world_size // nodes)
    entry = spec.entrypoint
    job = JobEnv(job_id=job_id, attempt=number, plan=plan, api_url=api_url,
                 token=SecretStr(token) if token is not None else None)
    return LaunchRequest(job=job, name=attempt_name(job_id, number), team=team, nodes=nodes,
                         procs_per_node=per_node, gpus_per_proc=0 if plan.gpu == "cpu" else 1,
                         command=list(entry.command) if entry else runtime_command(),
                         user_env=dict(entry.env) if entry else {}, image=entry.image if entry else None,
                         options=spec.backend, kueue=kueue)


def launch_preview(backends: Mapping[str, Backend], api_url: str | None = None) -> LaunchPreview:
    """A function that renders what attempt 1 of a not-yet-created job would send to its backend
    (`POST /v1/plans`, `shardctl submit --dry-run`); None when the spec's backend is not configured.
    It raises `ValueError` with the backend's reason when the backend would refuse the request (the
    API, which never imports backends, answers that as a 422)."""

    def preview(spec: TrainingSpec, plan: Plan) -> dict[str, Any] | None:
        backend = backends.get(spec.backend.kind)
        if backend is None:
            return None
        req = build_request(0, 1, plan=plan, spec=spec, team=spec.team or "default",
                            token="<job token, minted at submission>", api_url=api_url)
        try:  # every backend's preview is redacted by value as well as by name
            return dict(redact_strings(backend.render(req).model_dump(mode="json")))
        except SubmissionRefused as exc:
            raise ValueError(str(exc)) from exc

    return preview
