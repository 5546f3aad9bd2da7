"""Charts as data for inline SVG and CSS (no chart library): a line chart's points and axes, and a
memory bar's segments. Pure functions; the templates draw them (`_job_chart.html`, `_job_plan.html`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.planner.result import MemoryBreakdown

WIDTH, HEIGHT = 640, 200
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 16, 12, 32


@dataclass(frozen=True, slots=True)
class Series:
    """One line: `points` as an SVG polyline (`x,y x,y`), with the axis labels of its range."""

    label: str
    points: str
    y_min: float
    y_max: float
    x_min: int
    x_max: int
    count: int


def series(label: str, steps: list[int], values: list[float]) -> Series | None:
    """The polyline of `values` over `steps`, scaled into the chart's box; None without two finite points."""
    pairs = [(s, v) for s, v in zip(steps, values, strict=True) if v is not None and math.isfinite(v)]
    if len(pairs) < 2:
        return None
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y1 == y0:
        y0, y1 = y0 - 0.5 * (abs(y0) or 1), y1 + 0.5 * (abs(y1) or 1)
    span_x = (x1 - x0) or 1
    inner_w, inner_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM
    points = " ".join(f"{PAD_LEFT + (x - x0) / span_x * inner_w:.1f},"
                      f"{PAD_TOP + (1 - (y - y0) / (y1 - y0)) * inner_h:.1f}" for x, y in pairs)
    return Series(label=label, points=points, y_min=y0, y_max=y1, x_min=x0, x_max=x1, count=len(pairs))


@dataclass(frozen=True, slots=True)
class Segment:
    label: str
    bytes: int
    percent: float  # of the GPU's memory
    colour: str


#: Colours that tell the parts apart and keep a 3:1 contrast against the bar's light background.
_PARTS = [("params", "Parameters", "#1d4ed8"), ("grads", "Gradients", "#7c3aed"),
          ("optimizer", "Optimizer state", "#b45309"), ("activations", "Activations", "#047857"),
          ("logits", "Logits and loss", "#0e7490"), ("comm_buffers", "Communication buffers", "#be185d"),
          ("runtime_overhead", "Runtime overhead", "#4b5563"), ("allocator_margin", "Allocator margin", "#6b7280")]


def memory_segments(memory: MemoryBreakdown) -> list[Segment]:
    """The per-GPU memory parts as shares of the GPU's memory (the bar's full width); a bar over 100%
    is what does not fit."""
    capacity = max(memory.gpu_memory, memory.total, 1)
    return [Segment(label=label, bytes=getattr(memory, field), percent=100 * getattr(memory, field) / capacity,
                    colour=colour) for field, label, colour in _PARTS if getattr(memory, field) > 0]
