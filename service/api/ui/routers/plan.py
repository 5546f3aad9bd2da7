"""The Plan page (`/ui/plan`): paste a spec (YAML or JSON), see its plan, without submitting.

Contract:

- `POST /ui/plan` (CSRF) plans the pasted spec with the API's dry run (`POST /v1/plans`'s
  `service.api.submission.preview`): the plan, its memory and time breakdown, the
  alternatives and why each lost, or why nothing fits. Nothing is stored.
- A spec that is not YAML/JSON, breaks the spec's contract, or cannot be planned is refused in the
  API's words, each problem naming its field (`resources.gpus_per_node: ...`), with the text kept in
  the form to fix.
- When the plan fits, a "Submit" button posts the same text to `POST /ui/plan/submit` (CSRF), which
  queues it through the API's submit path (`service.api.submission.submit`: the same checks as
  `POST /v1/jobs`, a member's team and priority limit included) and opens the new job's page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Form, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from service.api.deps import Db
from service.api.errors import ApiError
from service.api.submission import preview, submit
from service.api.ui.errors import UiError
from service.api.ui.render import page
from service.api.ui.session import Csrf, Signed, UiSession
from service.planner import InvalidSpec, Plan
from service.spec import TrainingSpec, field_path
from service.store.vocab import Role

router = APIRouter(tags=["ui"], include_in_schema=False)
MAX_SPEC = 200_000  # characters: a spec is a few hundred


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the pasted spec: the field (dotted path, or `spec`) and what to do."""

    field: str
    message: str


class SpecRefused(Exception):
    def __init__(self, summary: str, problems: list[Problem]) -> None:
        super().__init__(summary)
        self.summary, self.problems = summary, problems


def parse_spec(text: str) -> TrainingSpec:
    """The spec in `text` (YAML, of which JSON is a part), or `SpecRefused` naming each bad field."""
    if not text.strip():
        raise SpecRefused("invalid spec: spec: empty", [Problem("spec", "paste a spec in YAML or JSON")])
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecRefused(f"invalid spec: not YAML or JSON{where}",
                          [Problem("spec", f"not YAML or JSON{where}: {problem}")]) from None
    if not isinstance(data, dict):
        raise SpecRefused("invalid spec: spec: expected a mapping",
                          [Problem("spec", f"expected a mapping of fields (name, model, training, resources...),"
                                           f" got {type(data).__name__}")])
    try:
        return TrainingSpec.model_validate(data)
    except ValidationError as exc:
        problems = [Problem(field_path(tuple(e["loc"])) or "spec", str(e["msg"]).removeprefix("Value error, "))
                    for e in exc.errors()]
        summary = "; ".join(f"{p.field}: {p.message}" for p in problems[:3])
        raise SpecRefused(f"invalid spec: {summary}", problems) from None


@dataclass(frozen=True)
class Verdict:
    """Why submitting the planned spec would be refused: the API's code, and its words."""

    code: str
    refused: SpecRefused

    @property
    def summary(self) -> str:
        return self.refused.summary

    @property
    def problems(self) -> list[Problem]:
        return self.refused.problems


def _refused(exc: ApiError | InvalidSpec) -> SpecRefused:
    if isinstance(exc, InvalidSpec):
        return SpecRefused(f"invalid spec: {exc}", [Problem(p.path, p.message) for p in exc.problems])
    fields = [Problem(f.loc, f.message) for f in exc.fields]
    return SpecRefused(exc.message, fields)


def _form(request: Request, session: UiSession, text: str, *, plan: Plan | None = None,
          refused: SpecRefused | None = None, verdict: Verdict | None = None, status_code: int = 200) -> Response:
    return page(request, session, "plan.html", title="Plan", spec_text=text, plan=plan, refused=refused,
                verdict=verdict, can_submit=session.principal.role in (Role.ADMIN, Role.MEMBER),
                status_code=status_code)


@router.get("/ui/plan")
def plan_form(request: Request, session: Signed) -> Response:
    return _form(request, session, "")


@router.post("/ui/plan")
def plan_spec(request: Request, session: Csrf, db: Db,
              spec: Annotated[str, Form(max_length=MAX_SPEC)] = "") -> Response:
    """The dry run (`submission.preview`, as `POST /v1/plans`): the plan, and what submitting it would
    answer; the Submit button only when it would queue the job."""
    app = request.app.state
    try:
        parsed = parse_spec(spec)
        dry = preview(db, session.principal, parsed, app.configured_backends, app.planner,
                      local_gpus=app.settings.local_gpus)
    except SpecRefused as exc:
        return _form(request, session, spec, refused=exc, status_code=422)
    except (ApiError, InvalidSpec) as exc:
        return _form(request, session, spec, refused=_refused(exc), status_code=getattr(exc, "status", 422))
    verdict = None if dry.refused is None else Verdict(dry.refused.code, _refused(dry.refused))
    return _form(request, session, spec, plan=dry.plan, verdict=verdict)


@router.post("/ui/plan/submit")
def submit_spec(request: Request, session: Csrf, db: Db,
                spec: Annotated[str, Form(max_length=MAX_SPEC)] = "") -> Response:
    if session.principal.role not in (Role.ADMIN, Role.MEMBER):
        raise UiError(403, "Not allowed", "Only admins and team members submit jobs.")
    app = request.app.state
    try:
        parsed = parse_spec(spec)
        job_id, _ = submit(db, session.principal, parsed, None, app.configured_backends,
                           app.planner, local_gpus=app.settings.local_gpus)
    except SpecRefused as exc:
        return _form(request, session, spec, refused=exc, status_code=422)
    except (ApiError, InvalidSpec) as exc:
        return _form(request, session, spec, refused=_refused(exc), status_code=getattr(exc, "status", 422))
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)
