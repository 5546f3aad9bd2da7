"""SHARDCTL_BOOTSTRAP_ADMIN_TOKEN: serve makes sure that admin token exists, idempotent across restarts and
replicas starting at once; a revocation stays; a value of another form or an id already taken is refused
without the value in the message."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import func, select

from service.cli import wiring
from service.settings import Settings
from service.store.models import ApiToken
from service.store.tokens import authenticate, create_token, revoke_token
from service.store.vocab import Role
from tests.server.procs import bootstrap_token


def _sessions(url: str, tmp_path: Path) -> wiring.Sessions:
    return wiring.open_store(Settings(database_url=url, data_dir=tmp_path), migrate=False)


def test_the_bootstrap_admin_token_is_created_once_and_works(db_url: str, tmp_path: Path) -> None:
    sessions, token = _sessions(db_url, tmp_path), bootstrap_token()
    assert wiring.ensure_bootstrap_admin(sessions, token) == "created"
    assert wiring.ensure_bootstrap_admin(sessions, token) == "present"  # a restart
    with sessions.begin() as session:
        principal = authenticate(session, token)
        assert principal is not None and principal.role == Role.ADMIN
        assert session.scalar(select(func.count()).select_from(ApiToken)) == 1
    assert not wiring.needs_first_admin(sessions)  # so serve creates no other first admin


def test_replicas_starting_at_once_create_it_once(postgres_url: str, tmp_path: Path) -> None:
    token = bootstrap_token()
    replicas = [_sessions(postgres_url, tmp_path) for _ in range(6)]
    with ThreadPoolExecutor(6) as pool:
        states = list(pool.map(lambda s: wiring.ensure_bootstrap_admin(s, token), replicas))
    assert sorted(states) == ["created"] + ["present"] * 5
    with replicas[0].begin() as session:
        assert session.scalar(select(func.count()).select_from(ApiToken).where(
            ApiToken.id == token.split("_")[1])) == 1
    for sessions in replicas:
        sessions.kw["bind"].dispose()


def test_a_revoked_bootstrap_token_stays_revoked(db_url: str, tmp_path: Path) -> None:
    sessions, token = _sessions(db_url, tmp_path), bootstrap_token()
    wiring.ensure_bootstrap_admin(sessions, token)
    with sessions.begin() as session:
        create_token(session, role=Role.ADMIN, name="the rotated-to admin")
        revoke_token(session, token.split("_")[1])
    assert wiring.ensure_bootstrap_admin(sessions, token) == "revoked"
    with sessions.begin() as session:
        assert authenticate(session, token) is None


def test_another_form_or_a_taken_id_is_refused_without_the_value(db_url: str, tmp_path: Path) -> None:
    sessions, token = _sessions(db_url, tmp_path), bootstrap_token()
    with pytest.raises(wiring.BootstrapRefused) as malformed:
        wiring.ensure_bootstrap_admin(sessions, "not-a-token-secretvalue")
    assert "secretvalue" not in str(malformed.value) and "shc_<id>_<secret>" in str(malformed.value)
    wiring.ensure_bootstrap_admin(sessions, token)
    other = token.rsplit("_", 1)[0] + "_" + "z" * 40
    with pytest.raises(wiring.BootstrapRefused) as taken:
        wiring.ensure_bootstrap_admin(sessions, other)
    assert token.split("_", 2)[2] not in str(taken.value) and "z" * 40 not in str(taken.value)
