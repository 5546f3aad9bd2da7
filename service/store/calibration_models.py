"""Calibration tables: one sample per succeeded run's report, and how far the reports were read.

`service.store.calibration` writes and reads them. A sample is keyed by the measurement it came
from, so reading the same report twice (two API replicas at once) cannot count it twice.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.store.models import Base, BigId, UtcDateTime, utcnow


class CalibrationSample(Base):
    """The model's prediction (before calibration, from the job's stored plan) and the measurement of
    one succeeded run of team `team_id`'s."""

    __tablename__ = "calibration_samples"
    __table_args__ = (Index("ix_calibration_samples_gpu_family_measurement_id", "gpu", "family", "measurement_id"),
                      Index("ix_calibration_samples_team_id_gpu_family_measurement_id",
                            "team_id", "gpu", "family", "measurement_id"))

    measurement_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    team_id: Mapped[int] = mapped_column(BigId, ForeignKey("teams.id"))
    gpu: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(64))
    predicted_step_s: Mapped[float] = mapped_column(Float)
    measured_step_s: Mapped[float | None] = mapped_column(Float)
    predicted_peak_bytes: Mapped[float] = mapped_column(Float)
    measured_peak_bytes: Mapped[float | None] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class CalibrationCursor(Base):
    """The single row (id 1): every measurement with an id up to `scanned_through` has been read."""

    __tablename__ = "calibration_cursor"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    scanned_through: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"))
