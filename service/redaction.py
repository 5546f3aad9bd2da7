"""Secrets in what shardctl shows: which variable names hold secrets, and how values that carry
credentials are hidden. Pure; the API's responses and every backend's preview use the same rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY")
REDACTED = "<redacted>"


def is_secret_env(key: str) -> bool:
    """Variables whose name says they hold a secret (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*CREDENTIAL*`,
    `*_KEY`...): never shown in a preview, and on Kubernetes and Slurm kept in their secret stores."""
    upper = key.upper()
    return upper == "KEY" or upper.endswith("_KEY") or any(marker in upper for marker in SECRET_MARKERS)


#: `scheme://user:password@host`: the password part (up to the `@`; a `/` ends the match, so a port
#: followed by a path is never taken for a password).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*:)(?P<password>[^\s/@]+)(?=@)")
#: Values that are credentials whatever the variable is called.
SECRET_VALUE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained tokens
    r"\bxox[a-z]-[A-Za-z0-9-]{8,}",  # Slack tokens
    r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",  # JWTs (a JSON header, base64url)
    r"\bshc_[A-Za-z0-9]+_[A-Za-z0-9_-]{8,}",  # shardctl tokens
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face tokens
    r"\bsk-[A-Za-z0-9_-]{20,}",  # OpenAI-style secret keys
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",  # PEM private keys
))


def redact_value(value: str) -> str:
    """`value` with the credentials it carries replaced by `<redacted>`: the password of a URL
    (`postgresql://u:<redacted>@db/x`) and anything shaped like a known key or token (AWS, GitHub,
    Slack, JWT, shardctl...), wherever it appears in the string."""
    out = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, value)
    for pattern in SECRET_VALUE_PATTERNS:
        out = pattern.sub(REDACTED, out)
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables as a preview shows them: the whole value hidden when the name says it is a
    secret (`is_secret_env`), otherwise the value with its credentials hidden (`redact_value`)."""
    return {k: REDACTED if is_secret_env(k) else redact_value(v) for k, v in env.items()}


def redact_strings(data: Any) -> Any:
    """`data` (JSON-like: dicts, lists, strings) with `redact_value` applied to every string in it; for
    the parts of a preview that are not an environment (command lines, rendered scripts)."""
    if isinstance(data, str):
        return redact_value(data)
    if isinstance(data, Mapping):
        return {k: redact_strings(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_strings(v) for v in data]
    return data
