"""The CLI's view of the API: where it is, which token to send, and errors as one readable line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import platformdirs

DEFAULT_URL = "http://127.0.0.1:8686"


class CliError(Exception):
    """A failure to show the user as one line (and exit 1)."""


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


def write_config(**values: str) -> Path:
    """Merge `values` into the config file, readable by its owner only (it holds a token)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**read_config(), **values}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


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
            raise CliError(describe_error(response))
        return response.json() if response.content else None

    def stream_lines(self, path: str, **kw: Any) -> Any:
        return self.http.stream("GET", path, timeout=None, **kw)


def describe_error(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:300]}"
    lines = [f"{error.get('message')} ({error.get('code')}, HTTP {response.status_code})"]
    lines += [f"  {f['loc']}: {f['message']}" for f in error.get("fields", [])]
    if response.status_code == 401:
        lines.append("  get a token with `shardctl token create --admin` (local) or ask an admin;"
                     " the CLI reads SHARDCTL_TOKEN or its config file")
    return "\n".join(lines)
