"""The dispatcher's queue view in the store: one row per waiting job, and when it was computed.

`service.store.queue_view` writes and reads them; `service.scheduling.queue_view` computes them.
The rows are a cache of one engine run, rewritten whole by each refresh: no foreign keys (a job that
left the queue since simply has a stale row until the next refresh, and readers check the job's own
status first).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.store.models import Base, BigId, Json, UtcDateTime


class QueueViewRow(Base):
    """One waiting job: its place in admission order and its explanation as its own team sees it."""

    __tablename__ = "queue_view"
    __table_args__ = (Index("ix_queue_view_gpu_ord", "gpu", "ord"),)

    job_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    ord: Mapped[int] = mapped_column(Integer)
    team: Mapped[str] = mapped_column(String(63))
    gpu: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer)
    pools: Mapped[str] = mapped_column(Text)  # the pools it may use, comma-separated
    doc: Mapped[dict[str, Any]] = mapped_column(Json)  # admitted, reasons, positions, others, eta


class QueueViewMeta(Base):
    """The single row (id 1) saying when the view was computed, over how many jobs, in how long.
    No row: no view (never computed, or invalidated by a change to pools or quotas)."""

    __tablename__ = "queue_view_meta"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    computed_at: Mapped[datetime] = mapped_column(UtcDateTime())
    jobs: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
