"""Process logging, configured once at start (`shardctl serve`, `shardctl worker`): `configure_logging`.

Two formats, one line per record:

- `text`: `2026-12-01T00:31:41.123Z INFO shardctl.access GET /v1/jobs 200 3.1ms  route=/v1/jobs status=200 ...`
- `json`: one JSON object per line with `ts` (ISO 8601, UTC, milliseconds), `level`, `logger`, `message`,
  every field passed with `extra=` (`job_id`, `route`, `status`, ...), `request_id` when the record was
  written while serving a request, and `exc` (the traceback) for `log.exception`.

Fields are whatever callers pass; callers never pass a token or an `Authorization` header.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any, Literal

LogFormat = Literal["text", "json"]

#: The id of the request being served (set by `service.api.access_log.AccessLog`), added to every record.
request_id_var: ContextVar[str | None] = ContextVar("shardctl_request_id", default=None)

#: Attributes every `LogRecord` has: anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
#: Libraries whose INFO lines repeat what our own lines say (httpx logs every request it sends).
_QUIET = ("httpx", "httpcore", "kubernetes.client.rest", "urllib3")


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of `record`: its `extra=` values, plus the current request id."""
    fields = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    request_id = request_id_var.get()
    if request_id is not None and "request_id" not in fields:
        fields["request_id"] = request_id
    return fields


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, the record's fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname, "logger": record.name,
                                "message": record.getMessage()}
        for key, value in fields_of(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`ts LEVEL logger message  key=value ...` (values that hold spaces are quoted as JSON strings)."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{_timestamp(record)} {record.levelname} {record.name} {record.getMessage()}"
        fields = fields_of(record)
        if fields:
            text += "  " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if not text or any(c.isspace() or c in '"=' for c in text) else text


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure_logging` installs (so a second call replaces it, and nothing else)."""


def configure_logging(fmt: LogFormat = "text", level: str = "INFO", stream: IO[str] | None = None) -> None:
    """Send every logger's records at `level` or above to `stream` (stderr) as `fmt` lines. Idempotent:
    a second call replaces the handler the first installed and leaves other handlers alone."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(handler)
    handler = _OurHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


def unconfigure_logging() -> None:
    """Remove the handler `configure_logging` installed (tests)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(handler)
