"""The whole database schema: importing this module loads every table's model module, and `metadata`
holds them all. Migrations (`migrations/env.py`), the drift check (`migrate.drift`) and whatever lists
every table read it here; a model module never imports another that imports it back."""

from __future__ import annotations

from sqlalchemy import MetaData

from service.store import calibration_models, models, notify_models, queue_models

#: Every table of the store (the model modules above all register on `models.Base`).
metadata: MetaData = models.Base.metadata
MODULES = (models, notify_models, calibration_models, queue_models)

__all__ = ["MODULES", "metadata"]
