"""The CLI's view of the API: where it is, which token to send, and errors as one readable line."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import platformdirs

from service.planner import FieldProblem

DEFAULT_URL = "http://127.0.0.1:8686"
EXIT_ERROR, EXIT_DOES_NOT_FIT = 1, 2  # as service.cli.render's (render imports rich; this module does not)
SPEC_ERROR_CODES = frozenset({"validation_error", "invalid_spec"})


class CliError(Exception):
    """A failure to show the user: a message, the API's problems with the request (one `field: message`
    line each), further notes, and the exit code (1 unless the API said no layout fits: 2)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_ERROR, code: str | None = None,
                 problems: Sequence[FieldProblem] = (), notes: Sequence[str] = ()) -> None:
        self.message, self.exit_code, self.code = message, exit_code, code
        self.problems, self.notes = list(problems), list(notes)
        super().__init__(message)

    @property
    def is_invalid_spec(self) -> bool:
        """The API refused the spec itself (its fields name what is wrong)."""
        return self.code in SPEC_ERROR_CODES and bool(self.problems)

    def __str__(self) -> str:
        lines = [self.message]
        lines += [f"  {p.path or '(spec)'}: {p.message}" for p in self.problems]
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


def config_path() -> Path:
    override = os.environ.get("SHARDCTL_CONFIG")
    return Path(override) if override else Path(platformdirs.user_config_dir("shardctl")) / "config.json"


def read_config() -> dict[str, Any]:
    path = config_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CliError(f"{path}: unreadable config ({exc}); delete it or fix it") from exc
    return data if isinstance(data, dict) else {}


def write_private_file(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically, the file readable by its owner only from the moment it exists:
    a fresh temporary file is created 0600 (`os.open(..., 0o600)`, never chmod'ed afterwards), written,
    then renamed over `path`. A missing folder is created 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_config(**values: str) -> Path:
    """Merge `values` into the config file, readable by its owner only (it holds a token)."""
    path = config_path()
    return write_private_file(path, json.dumps({**read_config(), **values}, indent=2))


def api_url() -> str:
    return os.environ.get("SHARDCTL_URL") or read_config().get("url") or DEFAULT_URL


def api_token() -> str | None:
    return os.environ.get("SHARDCTL_TOKEN") or read_config().get("token")


class Api:
    """A thin httpx client that raises `CliError` with the API's own error message."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or api_url()).rstrip("/")
        token = token or api_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach the shardctl API at {self.url} ({exc}); start it with"
                           " `shardctl serve` or set SHARDCTL_URL") from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response.json() if response.content else None

    def stream_lines(self, path: str, **kw: Any) -> Any:
        return self.http.stream("GET", path, timeout=None, **kw)


def _problems(items: Any) -> list[FieldProblem]:
    """`[{"loc": "a.b" or [...], "message": ...}]` (also `path`/`msg`) as `FieldProblem`s; others skipped."""
    problems = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        loc = item.get("loc", item.get("path", ""))
        parts = tuple(str(p) for p in loc) if isinstance(loc, list | tuple) else tuple(
            part for part in str(loc or "").split(".") if part)
        message = str(item.get("message", item.get("msg", ""))).removeprefix("Value error, ")
        problems.append(FieldProblem(loc=parts, message=message))
    return problems


def error_from_response(response: httpx.Response) -> CliError:
    """The API's error body (`{"error": {"code", "message", "fields", "details"}}`) as a `CliError`:
    the message, then each field problem (and each problem `details` carries) on its own line."""
    status = response.status_code
    try:
        error = response.json()["error"]
        str(error.get("code"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return CliError(f"HTTP {status}: {response.text[:300]}")
    return error_from_body(status, error)


def error_from_verdict(preview: dict[str, Any]) -> CliError | None:
    """The error `POST /v1/jobs` would answer for a spec, from its dry run (`POST /v1/plans`'s `verdict`,
    and the plan's reasons for `does_not_fit`): the same `CliError` a submission gets; None when the
    job would be queued."""
    verdict = preview.get("verdict") or {}
    if verdict.get("submittable", True):
        return None
    details = ({"reasons": preview.get("reasons") or [], "min_gpus_to_fit": preview.get("min_gpus_to_fit")}
               if verdict.get("code") == "does_not_fit" else {})
    return error_from_body(int(verdict.get("status") or 422), {**verdict, "details": details})


def error_from_body(status: int, error: dict[str, Any]) -> CliError:
    """`error_from_response` for an error body already read."""
    code, message = str(error.get("code")), str(error.get("message"))
    found = error.get("details")
    details: dict[str, Any] = found if isinstance(found, dict) else {}
    problems = _problems(error.get("fields")) + _problems(details.get("problems")) + _problems(details.get("fields"))
    notes: list[str] = []
    exit_code = EXIT_ERROR
    if code == "does_not_fit":
        exit_code = EXIT_DOES_NOT_FIT
        reasons = [str(r) for r in details.get("reasons") or []]
        if reasons:
            message, notes = "no layout fits", reasons
        if details.get("min_gpus_to_fit") is not None:
            notes.append(f"smallest GPU count that fits: {details['min_gpus_to_fit']}")
    elif problems and message.startswith("invalid request:"):
        message = "invalid request"  # the rest of it summarises the problems listed below
    elif problems and code == "invalid_spec":
        message = "invalid spec"
    if status == 401:
        notes.append("get a token with `shardctl token create --admin` (local) or ask an admin;"
                     " the CLI reads SHARDCTL_TOKEN or its config file")
    return CliError(f"{message} ({code}, HTTP {status})", exit_code=exit_code, code=code, problems=problems,
                    notes=notes)


def describe_error(response: httpx.Response) -> str:
    """The API's error as readable lines (see `error_from_response`)."""
    return str(error_from_response(response))
