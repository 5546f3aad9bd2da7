"""What a delivery sends: shardctl's JSON document, or a Slack-compatible `{"text": ...}`.

The document (`docs/notifications.md`) is written into the outbox with the event, so every attempt
sends the same facts; this module only lays it out, with its keys always in the same order.
"""

from __future__ import annotations

import json
from typing import Any

from service.store.notify_models import WebhookFormat

#: The document's top-level keys, in the order they are sent.
KEYS = ("id", "type", "created_at", "team", "job", "message", "data")


def document(payload: dict[str, Any]) -> dict[str, Any]:
    """`{"id", "type", "created_at", "team", "job": {"id", "name", "status", ...}, "message", "data"}`."""
    return {key: payload.get(key) for key in KEYS}


def slack_text(payload: dict[str, Any]) -> str:
    job = payload.get("job") or {}
    line = f"shardctl: job {job.get('id')} `{job.get('name')}` (team {payload.get('team')}): {payload.get('type')}"
    if job.get("status"):
        line += f", now {job['status']}"
    message = payload.get("message")
    return f"{line}. {message}" if message else line


def render(payload: dict[str, Any], fmt: WebhookFormat) -> bytes:
    """The request body for `payload` in format `fmt`, as UTF-8 JSON."""
    body: dict[str, Any] = {"text": slack_text(payload)} if fmt == WebhookFormat.SLACK else document(payload)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
