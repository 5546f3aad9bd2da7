"""Pools: `PUT/GET/DELETE /v1/pools/{name}`, `GET /v1/pools` (with capacity and what is in use).

Admins declare pools; every person may read them (a member needs them to write a spec that fits).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from pydantic import Field
from sqlalchemy.orm import Session

from service.api.deps import Admin, Db, Person
from service.api.errors import ApiError
from service.api.schemas import ErrorField, ErrorResponse
from service.names import Label
from service.scheduling.model import Pool
from service.scheduling.snapshot import running_jobs, waiting_jobs
from service.store.models import utcnow
from service.store.pools import API, SourcedPool, delete_pool, effective_pools, put_pool

router = APIRouter(prefix="/v1/pools", tags=["pools"])
ERRORS: dict[int | str, dict[str, object]] = {404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
PoolName = Annotated[Label, Path(min_length=1, max_length=63, description="The pool's name (a DNS label).")]


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


def _out(pools: list[SourcedPool], session: Session) -> list[PoolOut]:
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


@router.get("", response_model=list[PoolOut], summary="Pools in effect, with capacity and use")
def list_pools(_: Person, db: Db, request: Request) -> list[PoolOut]:
    """Every pool in effect: declared ones, and this machine's detected pools when no local pool is
    declared. Waiting demand counts each job under every pool of its backend and kind."""
    with db.begin() as session:
        return _out(effective_pools(session, request.app.state.settings.local_gpus), session)


@router.get("/{name}", response_model=PoolOut, responses=ERRORS)
def get_pool(name: PoolName, _: Person, db: Db, request: Request) -> PoolOut:
    with db.begin() as session:
        pools = effective_pools(session, request.app.state.settings.local_gpus)
        found = [p for p in pools if p.pool.name == name]
        if not found:
            raise ApiError(404, "not_found", f"no pool {name!r}; pools: {', '.join(p.pool.name for p in pools)}")
        return _out(found, session)[0]


@router.put("/{name}", response_model=PoolOut, status_code=200, responses={**ERRORS, 201: {"model": PoolOut}},
            summary="Declare or replace a pool (admin)")
def put(name: PoolName, body: PoolIn, _: Admin, db: Db, request: Request) -> Response:
    """201 when the pool is new, 200 when it replaced one. Declaring a pool of the local backend
    retires the detected ones. A pool that shrinks below what its admitted jobs hold lets them run
    and admits nothing more until they end."""
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
        out = _out([SourcedPool(pool, API)], session)[0]
    return Response(out.model_dump_json(), status_code=201 if created else 200, media_type="application/json")


@router.delete("/{name}", status_code=204, responses=ERRORS, summary="Remove a declared pool (admin)")
def delete(name: PoolName, _: Admin, db: Db) -> Response:
    """Jobs admitted to it run on; jobs that wait for its kind wait for another pool. 404 for a pool
    that is not declared; 409 for one detected from this machine (it goes away when a local pool is
    declared)."""
    with db.begin() as session:
        delete_pool(session, name)
    return Response(status_code=204)
