"""Pools: the pools in effect with their capacity and what is in use, and declaring and removing
one, as `GET/PUT/DELETE /v1/pools[/{name}]` answer and the dashboard's Pools page shows.

Every person may read pools (a member needs them to write a spec that fits); admins declare and
remove them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from pydantic import Field
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.ops.access import admin_only
from service.api.schemas import ErrorField
from service.names import Label
from service.scheduling.model import Pool
from service.scheduling.snapshot import running_jobs, waiting_jobs
from service.store.models import utcnow
from service.store.pools import API, SourcedPool, delete_pool, effective_pools, put_pool
from service.store.tokens import Principal


class PoolIn(Pool):
    """A pool as `PUT /v1/pools/{name}` takes it: `name` may be left out (the path names it)."""

    name: Label | None = Field(None, description="The pool's name; must equal the path's when given.")  # type: ignore[assignment]


class PoolOut(Pool):
    """A pool in effect, where it comes from, and its use now."""

    source: str = Field(description="api (declared here), file (SHARDCTL_POOLS_FILE) or detected (this machine).")
    in_use: int = Field(0, description="GPUs (cpu slots) held by admitted jobs.")
    free: int = Field(0, description="GPUs not held (negative when a shrunk pool is over-committed).")
    running_jobs: int = Field(0, description="Admitted jobs holding GPUs of it.")
    waiting_jobs: int = Field(0, description="Jobs of its backend and kind that wait for admission.")
    waiting_gpus: int = Field(0, description="GPUs those waiting jobs need.")


@dataclass(frozen=True, slots=True)
class Declared:
    """A pool as declared, with its use, and whether it is new (else it replaced one)."""

    pool: PoolOut
    created: bool


def with_use(session: Session, pools: list[SourcedPool]) -> list[PoolOut]:
    """`pools` with what admitted jobs hold of each and what waits for it now. Waiting demand counts
    each job under every pool of its backend and kind."""
    now = utcnow()
    used: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for r in running_jobs(session, pools, now):
        used[r.pool] += r.gpus
        count[r.pool] += 1
    waiting: dict[tuple[str, str], list[int]] = defaultdict(list)
    for w in waiting_jobs(session, sorted({p.pool.backend.value for p in pools}), now):
        waiting[(w.backend, w.gpu)].append(w.gpus)
    out = []
    for p in pools:
        demand = waiting.get((p.pool.backend.value, p.pool.gpu), [])
        out.append(PoolOut(**p.pool.model_dump(), source=p.source, in_use=used[p.pool.name],
                           free=p.pool.gpus - used[p.pool.name], running_jobs=count[p.pool.name],
                           waiting_jobs=len(demand), waiting_gpus=sum(demand)))
    return out


def list_pools(db: sessionmaker[Session], *, local_gpus: str | None) -> list[PoolOut]:
    """Every pool in effect, with its use: declared ones, and this machine's detected pools (from
    `local_gpus`) when no local pool is declared."""
    with db.begin() as session:
        return with_use(session, effective_pools(session, local_gpus))


def pool_in_effect(db: sessionmaker[Session], name: str, *, local_gpus: str | None) -> PoolOut:
    """Pool `name` in effect, with its use; a 404 naming the pools there are."""
    with db.begin() as session:
        pools = effective_pools(session, local_gpus)
        found = [p for p in pools if p.pool.name == name]
        if not found:
            raise ApiError(404, "not_found", f"no pool {name!r}; pools: {', '.join(p.pool.name for p in pools)}")
        return with_use(session, found)[0]


def declare_pool(db: sessionmaker[Session], principal: Principal, name: str, body: PoolIn) -> Declared:
    """Declare or replace pool `name` (admins only: a 403 otherwise); a 422 when `body` names another
    pool or `name` is not a pool name. Declaring a pool of the local backend retires the detected
    ones. A pool that shrinks below what its admitted jobs hold lets them run and admits nothing more
    until they end."""
    admin_only(principal)
    if body.name is not None and body.name != name:
        raise ApiError(422, "validation_error", f"the body names pool {body.name!r} but the path {name!r};"
                       " leave name out or make them equal", fields=[ErrorField(loc="name", message="must equal"
                                                                                 " the path's name")])
    try:
        pool = Pool.model_validate({**body.model_dump(exclude={"name"}), "name": name})
    except ValueError as exc:
        raise ApiError(422, "validation_error", f"invalid pool name {name!r}: {exc}",
                       fields=[ErrorField(loc="name", message="a DNS label: lowercase letters, digits and '-'")]
                       ) from exc
    with db.begin() as session:
        created = put_pool(session, pool, source=API)
        return Declared(with_use(session, [SourcedPool(pool, API)])[0], created)


def remove_pool(db: sessionmaker[Session], principal: Principal, name: str) -> None:
    """Remove declared pool `name` (admins only: a 403 otherwise): `NotFound` when none is declared,
    `Conflict` for one detected from this machine. Jobs admitted to it run on; jobs that wait for its
    kind wait for another pool."""
    admin_only(principal)
    with db.begin() as session:
        delete_pool(session, name)
