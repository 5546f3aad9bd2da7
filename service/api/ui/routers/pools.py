"""The Pools page (`/ui/pools`): capacity and use per pool, and totals per GPU kind.

Thin over the service layer: the rows are `GET /v1/pools`' (`service.api.ops.pools.list_pools`:
the pools in effect with what admitted jobs hold and what waits), filtered by backend and GPU kind. Pools
are a short list (declared by admins, or this machine's detected ones), read whole as the API does.
Every signed-in person may read them, as in the API.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from service.api.deps import Db
from service.api.ops.pools import PoolOut, list_pools
from service.api.ui.render import page
from service.api.ui.session import Signed
from service.backend_options import BackendKind

router = APIRouter(tags=["ui"], include_in_schema=False)


@dataclass
class KindTotal:
    gpu: str
    pools: int = 0
    gpus: int = 0
    in_use: int = 0
    waiting_gpus: int = 0

    @property
    def free(self) -> int:
        return self.gpus - self.in_use


def totals(pools: list[PoolOut]) -> list[KindTotal]:
    """Per GPU kind: pools, capacity, in use; waiting GPUs counted once per (backend, kind)."""
    out: dict[str, KindTotal] = {}
    seen: set[tuple[str, str]] = set()
    for p in pools:
        total = out.setdefault(p.gpu, KindTotal(p.gpu))
        total.pools += 1
        total.gpus += p.gpus
        total.in_use += p.in_use
        if (p.backend.value, p.gpu) not in seen:  # the API counts a waiting job under every pool of its kind
            seen.add((p.backend.value, p.gpu))
            total.waiting_gpus += p.waiting_gpus
    return [out[k] for k in sorted(out)]


@router.get("/ui/pools")
def pools_page(request: Request, session: Signed, db: Db,
               backend: Annotated[str, Query(max_length=16)] = "",
               gpu: Annotated[str, Query(max_length=64)] = "") -> Response:
    everything = list_pools(db, local_gpus=request.app.state.settings.local_gpus)
    problems = []
    if backend and backend not in {b.value for b in BackendKind}:
        problems.append(f"backend: {backend!r} is not one of {', '.join(b.value for b in BackendKind)}; ignored")
        backend = ""
    shown = [p for p in everything if (not backend or p.backend.value == backend) and (not gpu or p.gpu == gpu)]
    by_backend: dict[str, int] = defaultdict(int)
    for p in everything:
        by_backend[p.backend.value] += 1
    return page(request, session, "pools.html", title="Pools", pools=shown, totals=totals(shown), backend=backend,
                gpu=gpu, backends=list(BackendKind), kinds=sorted({p.gpu for p in everything}), problems=problems,
                unmanaged=[b.value for b in BackendKind if not by_backend.get(b.value)])
