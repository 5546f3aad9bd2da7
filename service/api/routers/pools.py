"""Pools: `PUT/GET/DELETE /v1/pools/{name}`, `GET /v1/pools` (with capacity and what is in use).

Admins declare pools; every person may read them (a member needs them to write a spec that fits).
The routes read the request and call the service layer (`service.api.ops.pools`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from service.api.deps import Admin, Db, Person
from service.api.ops import pools as ops
from service.api.ops.pools import PoolIn, PoolOut
from service.api.schemas import ErrorResponse
from service.names import Label

router = APIRouter(prefix="/v1/pools", tags=["pools"])
ERRORS: dict[int | str, dict[str, object]] = {404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
PoolName = Annotated[Label, Path(min_length=1, max_length=63, description="The pool's name (a DNS label).")]


@router.get("", response_model=list[PoolOut], summary="Pools in effect, with capacity and use")
def list_pools(_: Person, db: Db, request: Request) -> list[PoolOut]:
    """Every pool in effect: declared ones, and this machine's detected pools when no local pool is
    declared. Waiting demand counts each job under every pool of its backend and kind."""
    return ops.list_pools(db, local_gpus=request.app.state.settings.local_gpus)


@router.get("/{name}", response_model=PoolOut, responses=ERRORS)
def get_pool(name: PoolName, _: Person, db: Db, request: Request) -> PoolOut:
    return ops.pool_in_effect(db, name, local_gpus=request.app.state.settings.local_gpus)


@router.put("/{name}", response_model=PoolOut, status_code=200, responses={**ERRORS, 201: {"model": PoolOut}},
            summary="Declare or replace a pool (admin)")
def put(name: PoolName, body: PoolIn, principal: Admin, db: Db) -> Response:
    """201 when the pool is new, 200 when it replaced one. Declaring a pool of the local backend
    retires the detected ones. A pool that shrinks below what its admitted jobs hold lets them run
    and admits nothing more until they end."""
    declared = ops.declare_pool(db, principal, name, body)
    return Response(declared.pool.model_dump_json(), status_code=201 if declared.created else 200,
                    media_type="application/json")


@router.delete("/{name}", status_code=204, responses=ERRORS, summary="Remove a declared pool (admin)")
def delete(name: PoolName, principal: Admin, db: Db) -> Response:
    """Jobs admitted to it run on; jobs that wait for its kind wait for another pool. 404 for a pool
    that is not declared; 409 for one detected from this machine (it goes away when a local pool is
    declared)."""
    ops.remove_pool(db, principal, name)
    return Response(status_code=204)
