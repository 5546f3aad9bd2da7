"""Errors the runtime raises for layouts or inputs it cannot honour."""

from __future__ import annotations


class UnsupportedLayout(ValueError):
    """A layout field (or combination) the runtime cannot apply here; names the field and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"layout.{field}: {message}")
        self.field = field


class WorldMismatch(RuntimeError):
    """The launched world does not match the plan's dp*tp*pp*cp."""
