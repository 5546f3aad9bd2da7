"""Real-browser fixtures for the dashboard (`service/api/ui`): Debian's Chromium driven by Playwright.

- `dashboard`: one live server per test module: the API app (with the dashboard) under uvicorn on a
  free port, a real dispatcher thread with the local backend running tiny CPU jobs, on SQLite. It
  mints tokens straight in the store (`dashboard.token(...)`) and talks to the API with httpx.
  `quiet_dashboard` is the same without a dispatcher: jobs stay QUEUED.
- `browser`: Chromium (`/usr/bin/chromium`, or `SHARDCTL_CHROMIUM`), launched once per session.
  Playwright's own browser download is never used. Without Chromium or the `playwright` package the
  tests skip with the reason on a laptop and fail under `CI=true` (`scripts/setup.sh` installs both).
- `page`: a fresh browser context (no cookies) and page, 1440x900.
- `sign_in(page, base, token)`, `run_axe(page)` and `screenshot(page, name)` are the helpers pages'
  tests share; screenshots go to `$SHARDCTL_SCREENSHOTS` or `test-artifacts/screenshots/`.

Other pages' tests (Queue, Teams, Pools, Plan, Admin) reuse these fixtures as they are.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.app import create_app
from service.settings import Settings
from service.store import migrate
from service.store.db import make_engine, make_sessionmaker
from service.store.tokens import create_token, ensure_team
from tests.db_fixtures import LiveServer
from workers.backends.local import LocalBackend
from workers.backends.outputs import BackendOutputs
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "service/api/ui/static/vendor/axe/axe.min.js"
CHROMIUM = os.environ.get("SHARDCTL_CHROMIUM", "/usr/bin/chromium")
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run: {why}. CI must run them: scripts/setup.sh dev installs the"
                    " playwright package and, as root, Debian's chromium", pytrace=False)
    pytest.skip(f"browser tests skipped: {why} (apt-get install chromium; pip install playwright)")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed")
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)) and shutil.which(CHROMIUM) is None:
        _unavailable(f"no Chromium at {CHROMIUM} (set SHARDCTL_CHROMIUM to another path)")
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=15_000)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


@dataclass
class Dashboard:
    """A live server with a dispatcher; `url` is its base URL."""

    url: str
    sessions: Any
    _teams: dict[str, int] = field(default_factory=dict)

    def token(self, role: str = "member", team: str | None = None) -> str:
        with self.sessions.begin() as session:
            team_row = ensure_team(session, team) if team else None
            _, secret = create_token(session, role=role, team=team_row)  # type: ignore[arg-type]
        return secret

    def api(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _serve(folder: Path, *, dispatch: bool) -> Iterator[Dashboard]:
    url = f"sqlite:///{folder / 'shardctl.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, data_dir=folder, events_poll_s=0.2, logs_poll_s=0.2)
    engine = make_engine(url)
    backends = {"local": LocalBackend(folder / "runs")}
    app = create_app(settings, engine=engine, configured_backends=["local"], log_reader=BackendOutputs(backends))
    stop = threading.Event()
    with LiveServer(app) as base:
        thread = None
        if dispatch:
            sessions = make_sessionmaker(make_engine(url))
            dispatcher = Dispatcher(sessions, backends, DispatcherConfig(api_url=base, retry_backoff_s=0.1))
            thread = threading.Thread(target=dispatcher.run_forever, args=(stop, 0.2), daemon=True,
                                      name="dispatcher")
            thread.start()
        yield Dashboard(url=base, sessions=app.state.sessions)
        stop.set()
        if thread is not None:
            thread.join(timeout=30)
    engine.dispose()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A live server and a dispatcher running jobs on the local backend."""
    yield from _serve(tmp_path_factory.mktemp("dashboard"), dispatch=True)


@pytest.fixture(scope="module")
def quiet_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A live server without a dispatcher: submitted jobs stay QUEUED (lists, filters, pages)."""
    yield from _serve(tmp_path_factory.mktemp("quiet"), dispatch=False)


def expect(target: Any) -> Any:
    """Playwright's `expect` (imported here, so a laptop without playwright skips instead of failing to collect)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)


def sign_in(page: Any, base: str, token: str, next_path: str = "/ui/jobs") -> None:
    """Sign in through the form, as a person would, and land on `next_path`."""
    page.goto(f"{base}{next_path}")
    assert "/ui/login" in page.url, page.url
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}{next_path}*")


def run_axe(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now (WCAG 2.x A and AA rules)."""
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("""async () => {
        const r = await axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a',
                                                                           'wcag21aa', 'best-practice']}});
        return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                       nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}));
    }""")
    return [v for v in result if v["impact"] in ("serious", "critical")]


def screenshot_dir() -> Path:
    folder = Path(os.environ.get("SHARDCTL_SCREENSHOTS") or ROOT / "test-artifacts" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshots(page: Any, name: str) -> list[Path]:
    """Full-page screenshots of the page at 1440x900 and at 390x844 (a phone); the desktop size is restored."""
    shots = []
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        path = screenshot_dir() / f"{name}-{label}.png"
        page.screenshot(path=str(path), full_page=True)
        shots.append(path)
    page.set_viewport_size(DESKTOP)
    return shots
