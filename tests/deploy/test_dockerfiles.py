"""The images' Dockerfiles, linted (no container engine can build them here: docs/deploy.md says why).

Parsed with `dockerfile-parse`; each check is something an operator relies on: the final stage runs as
a non-root user (the chart's runAsNonRoot needs a numeric one), every base is pinned (no `latest`, no
untagged image), the control plane never installs torch, the entrypoint is the right program, and
every COPY source exists in the build context (the repository root) and is not excluded by
.dockerignore."""

from __future__ import annotations

import fnmatch
import io
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
CONTROL = ROOT / "deploy" / "Dockerfile"
RUNTIME = ROOT / "deploy" / "Dockerfile.runtime"


def _parse(path: Path) -> DockerfileParser:
    with path.open("rb") as f:  # a file object: the parser writes nothing next to it
        parser = DockerfileParser(fileobj=io.BytesIO(f.read()))
    return parser


def _stages(parser: DockerfileParser) -> list[list[dict[str, Any]]]:
    """The instructions of each stage (a FROM starts one)."""
    stages: list[list[dict[str, Any]]] = []
    for item in parser.structure:
        if item["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(item)
    return stages


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"use the exec form (a JSON list), not {value!r}"
    return [str(v) for v in parsed]


def _ignored(path: str) -> bool:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p) for p in patterns)


@pytest.mark.parametrize("path", [CONTROL, RUNTIME], ids=["control", "runtime"])
def test_final_stage_runs_as_a_numeric_non_root_user(path: Path) -> None:
    final = _stages(_parse(path))[-1]
    users = [i["value"].split(":")[0] for i in final if i["instruction"] == "USER"]
    assert users, f"{path.name}: the final stage has no USER (it would run as root)"
    assert users[-1].isdigit() and int(users[-1]) != 0, f"{path.name}: USER {users[-1]} (numeric, not 0)"
    # The chart's podSecurityContext runs as that same uid.
    assert f"--uid {users[-1]}" in " ".join(i["value"] for i in final if i["instruction"] == "RUN")


@pytest.mark.parametrize("path", [CONTROL, RUNTIME], ids=["control", "runtime"])
def test_every_base_image_is_pinned(path: Path) -> None:
    parser = _parse(path)
    bases = [b for b in parser.parent_images if b not in {s[0]["value"].split(" AS ")[-1].strip().lower()
                                                          for s in _stages(parser)}]
    assert bases, f"{path.name}: no base image"
    for base in bases:
        assert "${" not in base, f"{path.name}: {base} has no default"
        name, _, tag = base.rpartition(":")
        assert name and "/" not in tag and tag and tag != "latest", f"{path.name}: base {base} must carry a tag"


def test_control_plane_image_has_no_torch_and_serves_by_default() -> None:
    parser = _parse(CONTROL)
    runs = " ".join(i["value"] for i in parser.structure if i["instruction"] == "RUN")
    assert not re.search(r"pip install [^&]*(torch|\[runtime|\.\[)", runs), runs
    assert 'import torch" 2>/dev/null; then' in runs  # the build fails if torch slipped in
    final = _stages(parser)[-1]
    entry = [_exec_form(i["value"]) for i in final if i["instruction"] == "ENTRYPOINT"][-1]
    cmd = [_exec_form(i["value"]) for i in final if i["instruction"] == "CMD"][-1]
    assert entry == ["shardctl"] and cmd[:1] == ["serve"] and "0.0.0.0" in cmd
    # `shardctl` is the console script pyproject.toml declares.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "shardctl" in project["project"]["scripts"]
    assert "torch" not in " ".join(project["project"]["dependencies"])


def test_runtime_image_runs_the_reference_trainer() -> None:
    parser = _parse(RUNTIME)
    final = _stages(parser)[-1]
    entry = [_exec_form(i["value"]) for i in final if i["instruction"] == "ENTRYPOINT"][-1]
    assert entry == ["python", "-m", "workers.runtime"]
    assert (ROOT / "workers" / "runtime" / "__main__.py").is_file()
    runs = " ".join(i["value"] for i in parser.structure if i["instruction"] == "RUN")
    assert 'pip install ".[runtime]"' in runs
    base = parser.parent_images[0]
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["runtime"]
    torch = next(p for p in pinned if p.startswith("torch=="))
    assert f"pytorch/pytorch:{torch.removeprefix('torch==')}-cuda" in base, (base, torch)


@pytest.mark.parametrize("path", [CONTROL, RUNTIME], ids=["control", "runtime"])
def test_copy_sources_exist_and_are_in_the_build_context(path: Path) -> None:
    copies = [i["value"].split() for i in _parse(path).structure if i["instruction"] == "COPY"]
    sources = [s for args in copies if not any(a.startswith("--from") for a in args)
               for s in args[:-1] if not s.startswith("--")]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such path in the repository"
        assert not _ignored(source), f"{path.name}: COPY {source} is excluded by .dockerignore"
    assert _ignored(".venv") and _ignored("tests")  # the context stays small
