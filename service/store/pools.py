"""Pools in the store: declared through the API (`source` api), loaded from SHARDCTL_POOLS_FILE
(`file`), or detected on this machine (`detected`).

The pools in effect (`effective_pools`) are the stored ones, plus the local machine's detected
pools when no pool of the local backend is stored: the local backend always has a pool, so a local
job is matched against real hardware. A backend with no pool at all (Slurm, Kubernetes until one is
declared) is not managed by admission: its jobs go to the backend as they come and its own scheduler
queues them.

A pool with `kueue: true` is managed by Kueue, not by shardctl's engine: a job of its backend and GPU
kind is admitted to it as soon as a dispatcher leases it (`kueue_kinds`), the engine's snapshot leaves
the pool and its jobs out, and the job's workload is labelled with the team's LocalQueue and priority
class (`kueue_queue_for`). Where a backend and kind have both, the Kueue pools take its jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.backend_options import BackendKind
from service.scheduling.bands import bands_of
from service.scheduling.config_file import PoolsFile
from service.scheduling.detect import local_pools
from service.scheduling.kueue_names import KueueQueue, kueue_queue
from service.scheduling.model import Pool
from service.store.db import upsert_into
from service.store.models import PoolRow, utcnow
from service.store.queue_view import invalidate
from service.store.quotas import all_quotas, put_quotas_by_name
from service.store.tokens import Conflict, NotFound

API, FILE, DETECTED = "api", "file", "detected"
SOURCES = (API, FILE, DETECTED)


@dataclass(frozen=True, slots=True)
class SourcedPool:
    """A pool in effect and where it comes from (api, file or detected)."""

    pool: Pool
    source: str


_STORED = select(PoolRow.pool, PoolRow.source).order_by(PoolRow.name)  # built once: every submission reads it


def stored_pools(session: Session) -> list[SourcedPool]:
    """Every stored pool, by name (a Core read on the session's connection: no ORM rows)."""
    return [SourcedPool(pool, source) for pool, source in session.connection().execute(_STORED)]


def effective_pools(session: Session, local_gpus: str | None = None) -> list[SourcedPool]:
    """The pools admission and submit use: the stored ones, and this machine's detected pools when
    none of the local backend is stored (`local_gpus`: SHARDCTL_LOCAL_GPUS, instead of detecting)."""
    return in_effect(stored_pools(session), local_gpus)


def in_effect(stored: Iterable[SourcedPool], local_gpus: str | None = None) -> list[SourcedPool]:
    """`effective_pools` from the stored pools already read (by name or not)."""
    pools = list(stored)
    if not any(p.pool.backend == BackendKind.LOCAL for p in pools):
        taken = {p.pool.name for p in pools}
        pools += [SourcedPool(p, DETECTED) for p in local_pools(local_gpus) if p.name not in taken]
    return sorted(pools, key=lambda p: p.pool.name)


def get_pool(session: Session, name: str, local_gpus: str | None = None) -> SourcedPool:
    for p in effective_pools(session, local_gpus):
        if p.pool.name == name:
            return p
    raise NotFound(f"no pool {name!r}")


def put_pool(session: Session, pool: Pool, *, source: str = API) -> bool:
    """Create or replace the pool `pool.name`; True when it is new. Idempotent under concurrent calls
    (an upsert: the last one to commit wins, none fails). Declaring a pool of the local backend retires
    the detected ones (declared pools replace what detection guessed)."""
    invalidate(session)
    if pool.backend == BackendKind.LOCAL and source != DETECTED:
        session.execute(delete(PoolRow).where(PoolRow.source == DETECTED, PoolRow.name != pool.name))
    existed = session.scalar(select(PoolRow.name).where(PoolRow.name == pool.name)) is not None
    insert = upsert_into(session, PoolRow).values(name=pool.name, pool=pool, source=source, updated_at=utcnow())
    session.execute(insert.on_conflict_do_update(index_elements=["name"], set_={
        "pool": insert.excluded.pool, "source": insert.excluded.source, "updated_at": insert.excluded.updated_at}))
    session.expire_all()  # a row this session loaded before holds the old pool
    return not existed


def delete_pool(session: Session, name: str) -> None:
    """Remove a stored pool; `NotFound` when there is none by that name, `Conflict` for a pool detected
    from this machine (it would be detected again at once). Jobs admitted to it keep running; waiting
    jobs of its kind wait for another pool (`no_matching_pool`)."""
    row = session.get(PoolRow, name, with_for_update=True)
    if row is None:
        raise NotFound(f"no pool {name!r} is declared (detected pools go away when a local pool is declared)")
    if row.source == DETECTED:
        raise Conflict(f"pool {name!r} is detected from this machine, not declared: it cannot be removed. Declare"
                       " the local pools you want (PUT /v1/pools/{name} with backend local), which retires it")
    invalidate(session)
    session.delete(row)


def replace_file_pools(session: Session, pools: list[Pool]) -> None:
    """Make the file's pools the `file` pools: each is written (over any of its name), and `file`
    pools the file no longer names are removed. Pools declared through the API of another name stay."""
    names = {p.name for p in pools}
    session.execute(delete(PoolRow).where(PoolRow.source == FILE, PoolRow.name.not_in(names)))
    for pool in pools:
        put_pool(session, pool, source=FILE)


def record_detected(session: Session, local_gpus: str | None = None) -> list[Pool]:
    """At start (serve, worker): store this machine's pools as `detected` when no pool of the local
    backend is declared, so that an API on another host sees what the dispatcher's host has. Returns
    the pools written ([] when local pools are declared)."""
    declared = session.scalars(select(PoolRow).where(PoolRow.source != DETECTED)).all()
    if any(r.pool.backend == BackendKind.LOCAL for r in declared):
        session.execute(delete(PoolRow).where(PoolRow.source == DETECTED))
        return []
    taken = {r.name for r in declared}
    found = [p for p in local_pools(local_gpus) if p.name not in taken]
    session.execute(delete(PoolRow).where(PoolRow.source == DETECTED, PoolRow.name.not_in({p.name for p in found})))
    for pool in found:
        put_pool(session, pool, source=DETECTED)
    return found


def load_at_start(session: Session, pools_file: PoolsFile | None, local_gpus: str | None = None) -> None:
    """What `serve` and `worker` do at start: the pools file's pools become the `file` pools and its
    teams' quotas are written (teams it names are created), then this machine's pools are recorded as
    `detected` when no local pool is declared."""
    if pools_file is not None:
        replace_file_pools(session, pools_file.pools)
        put_quotas_by_name(session, pools_file.teams)
    record_detected(session, local_gpus)


def matching(pools: list[SourcedPool], backend: str, gpu: str) -> list[Pool]:
    """The pools of `backend` whose GPU kind is `gpu`, largest first."""
    return sorted((p.pool for p in pools if p.pool.backend == backend and p.pool.gpu == gpu),
                  key=lambda p: (-p.gpus, p.name))


def managed(pools: list[SourcedPool], backend: str) -> bool:
    """Whether admission manages `backend`: some pool in effect is of that backend."""
    return any(p.pool.backend == backend for p in pools)


def kueue_kinds(pools: list[SourcedPool]) -> dict[tuple[str, str], str]:
    """(backend, GPU kind) -> the Kueue-managed pool a waiting job of that backend and kind is admitted
    to: the largest such pool, then by name. Kinds without a Kueue pool are absent."""
    out: dict[tuple[str, str], str] = {}
    for p in sorted((p.pool for p in pools if p.pool.kueue), key=lambda p: (-p.gpus, p.name)):
        out.setdefault((p.backend.value, p.gpu), p.name)
    return out


def kueue_queue_for(session: Session, pool: str | None, team: str, priority: int) -> KueueQueue | None:
    """The LocalQueue and priority class of a job admitted to `pool` (its `jobs.pool`), when that pool is
    stored and Kueue-managed; None otherwise (no pool, a shardctl-managed pool, a pool since deleted).
    The bands come from the quotas in the store, as `shardctl export kueue` makes them from the file."""
    row = None if pool is None else session.get(PoolRow, pool)
    if row is None or not row.pool.kueue:
        return None
    return kueue_queue(team, priority, bands_of(all_quotas(session).values()))


__all__ = ["API", "DETECTED", "FILE", "SourcedPool", "delete_pool", "effective_pools", "get_pool", "in_effect",
           "kueue_kinds", "kueue_queue_for", "load_at_start", "managed", "matching", "put_pool", "record_detected",
           "replace_file_pools", "stored_pools"]
