"""`shardctl token revoke` takes the id or a unique prefix of it, as `token list` may show ids cut short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli.main import app
from service.store.models import ApiToken
from service.store.tokens import MIN_ID_PREFIX, Conflict, NotFound, token_by_id
from tests.db_fixtures import Env

runner = CliRunner()


def _token_with_id(env: Env, token_id: str, name: str) -> str:
    """An admin token whose id is `token_id` (ids are random: rename one to make prefixes collide)."""
    secret = env.token("admin", name=name)
    with env.app.state.sessions.begin() as session:
        session.get(ApiToken, secret.split("_")[1]).id = token_id
    return token_id


@pytest.fixture
def ids(env: Env) -> dict[str, str]:
    return {name: _token_with_id(env, token_id, name) for name, token_id in (
        ("a", "feed0001aaaa0000"), ("b", "feed0002bbbb0000"), ("c", "beef0003cccc0000"))}


def test_store_finds_a_token_by_id_or_unique_prefix(env: Env, ids: dict[str, str]) -> None:
    with env.app.state.sessions.begin() as session:
        assert token_by_id(session, ids["a"]).name == "a"
        assert token_by_id(session, "feed0002").name == "b"
        assert token_by_id(session, "beef").name == "c"
        with pytest.raises(Conflict, match=r"feed0001aaaa0000.*feed0002bbbb0000"):
            token_by_id(session, "feed")
        with pytest.raises(NotFound, match="no token 'cafe0'"):
            token_by_id(session, "cafe0")
        with pytest.raises(NotFound, match=f"at least {MIN_ID_PREFIX} characters"):
            token_by_id(session, "bee")
        with pytest.raises(NotFound):
            token_by_id(session, "feed%")  # LIKE wildcards are matched literally
        with pytest.raises(NotFound):
            token_by_id(session, "fe_d")


@pytest.fixture
def cli(env: Env, live: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SHARDCTL_CONFIG", str(tmp_path / "cli.json"))
    monkeypatch.setenv("SHARDCTL_URL", live)
    monkeypatch.setenv("SHARDCTL_DATABASE_URL", env.url)
    admin = env.token("admin", name="operator")
    monkeypatch.setenv("SHARDCTL_TOKEN", admin)

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
        return result.exit_code, result.output

    return run


def _revoked(cli, token_id: str) -> bool:  # type: ignore[no-untyped-def]
    code, out = cli("token", "list", "--json")
    assert code == 0, out
    return next(t for t in json.loads(out) if t["id"] == token_id)["revoked_at"] is not None


def test_revoke_by_unique_prefix(cli, ids: dict[str, str]) -> None:
    code, out = cli("token", "revoke", "feed0002")
    assert code == 0, out
    assert out.strip() == f"revoked {ids['b']} (b)"  # the whole id, so the user sees which
    assert _revoked(cli, ids["b"]) and not _revoked(cli, ids["a"])
    assert cli("token", "revoke", "feed0002")[0] == 0  # idempotent


def test_an_ambiguous_prefix_names_the_candidates_and_revokes_nothing(cli, ids: dict[str, str]) -> None:
    code, out = cli("token", "revoke", "feed")
    assert code == 1
    assert "ambiguous" in out and ids["a"] in out and ids["b"] in out and ids["c"] not in out
    assert not _revoked(cli, ids["a"]) and not _revoked(cli, ids["b"])


def test_no_match_is_no_token(cli, ids: dict[str, str]) -> None:
    code, out = cli("token", "revoke", "cafe0000")
    assert code == 1 and "no token 'cafe0000'" in out


def test_token_list_shows_whole_ids(cli, ids: dict[str, str]) -> None:
    result = runner.invoke(app, ["token", "list"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    for token_id in ids.values():
        assert token_id in result.output
