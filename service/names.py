"""Name types with messages in words: a rejected name says what a good one looks like, not a regex."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

LABEL_RULE = "1 to 63 lower-case letters, digits or '-', starting and ending with a letter or digit (e.g. ml-infra)"
JOB_NAME_RULE = "1 to 200 letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. llama-8b.run_2)"


def check_label(value: str) -> str:
    if not _LABEL.match(value):
        raise ValueError(f"{value!r} is not a valid name: use {LABEL_RULE}")
    return value


def check_job_name(value: str) -> str:
    if not _JOB_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid job name: use {JOB_NAME_RULE}")
    return value


#: Team names and Kubernetes namespaces (a DNS label). The schema states the rule the validator enforces
#: (the validator, not a schema pattern, checks it: its message is in words).
Label = Annotated[str, AfterValidator(check_label), WithJsonSchema(
    {"type": "string", "pattern": _LABEL.pattern, "minLength": 1, "maxLength": 63, "description": LABEL_RULE})]
JobName = Annotated[str, AfterValidator(check_job_name), WithJsonSchema(
    {"type": "string", "pattern": _JOB_NAME.pattern, "minLength": 1, "maxLength": 200, "description": JOB_NAME_RULE})]
