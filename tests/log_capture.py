"""Capture what the process logs, formatted as `shardctl serve` / `worker` would write it."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from service.observability.logs import LogFormat, configure_logging, unconfigure_logging


class Captured:
    """The lines written so far, raw (`text`) or parsed (`records`, JSON format only)."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def records(self, logger: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        """Every line parsed as JSON (each must parse), those of `logger` with `fields` when given."""
        parsed = [json.loads(line) for line in self.text.splitlines() if line.strip()]
        return [r for r in parsed if (logger is None or r["logger"] == logger)
                and all(r.get(k) == v for k, v in fields.items())]


@contextmanager
def captured_logs(fmt: LogFormat = "json", level: str = "INFO") -> Iterator[Captured]:
    """Configure logging as the commands do, into a buffer; restore the root level afterwards."""
    root_level = logging.getLogger().level
    stream = io.StringIO()
    configure_logging(fmt, level, stream=stream)
    try:
        yield Captured(stream)
    finally:
        unconfigure_logging()
        logging.getLogger().setLevel(root_level)
