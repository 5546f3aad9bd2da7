"""service/cli/wiring.py is the one module of the control plane that imports workers, and what it builds."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from service.cli import wiring
from service.settings import Settings

SERVICE = Path(__file__).resolve().parents[2] / "service"
WIRING = SERVICE / "cli" / "wiring.py"


def _imports_workers(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "workers":
            return True
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "workers" for a in node.names):
            return True
    return False


def test_only_the_wiring_module_imports_workers() -> None:
    offenders = sorted(str(p.relative_to(SERVICE.parent)) for p in SERVICE.rglob("*.py")
                       if p != WIRING and _imports_workers(p))
    assert offenders == []
    assert _imports_workers(WIRING)


def test_the_cli_loads_workers_only_when_it_builds_the_system() -> None:
    code = ("import sys, service.cli.main\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'workers'], 'workers loaded'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_wiring_builds_store_admin_backends_dispatcher_and_app(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'shardctl.db'}", data_dir=tmp_path)
    sessions = wiring.open_store(settings)
    assert wiring.needs_first_admin(sessions)
    assert wiring.bootstrap_admin(sessions, "first").startswith("shc_")
    assert not wiring.needs_first_admin(sessions)
    backends = wiring.make_backends(settings)
    assert "local" in backends
    dispatcher = wiring.make_dispatcher(settings, sessions, backends, public_url="http://127.0.0.1:1")
    assert dispatcher.config.api_url == "http://127.0.0.1:1" and set(dispatcher.backends) == set(backends)
    app = wiring.make_app(settings, sessions, backends, public_url="http://127.0.0.1:1")
    assert app.state.launch_preview is not None
    assert app.state.configured_backends == frozenset(backends)
    sessions.kw["bind"].dispose()


def test_an_api_apart_from_its_dispatchers_takes_the_backends_from_settings(tmp_path: Path) -> None:
    """An API pod has no sbatch on PATH; SHARDCTL_BACKENDS says what the installation's workers run."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'shardctl.db'}", data_dir=tmp_path,
                        backends=["slurm"])
    sessions = wiring.open_store(settings)
    app = wiring.make_app(settings, sessions, wiring.make_backends(settings), public_url="http://127.0.0.1:1")
    assert app.state.configured_backends == frozenset({"slurm"})
    sessions.kw["bind"].dispose()
