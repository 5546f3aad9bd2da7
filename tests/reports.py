"""Runtime reports (`workers/runtime/report.py`'s document) for tests that post or store one."""

from __future__ import annotations

from typing import Any

from service.planner.result import Plan


def report(plan: Plan, *, step: float, memory: float, status: str = "succeeded") -> dict[str, Any]:
    """A runtime report measuring `step` x the plan's step time and `memory` x its peak allocated bytes."""
    m = plan.memory
    peak = m.total - m.runtime_overhead - m.allocator_margin
    return {"status": status, "plan": plan.name, "layout": plan.layout.to_dict(), "world_size": plan.world_size,
            "device": "cpu", "steps": 5,
            "predicted": {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "peak_allocated": peak,
                          "peak_reserved": m.total - m.runtime_overhead, "total": m.total,
                          "step_s": plan.time.step_s, "tokens_per_s": plan.time.tokens_per_s, "mfu": plan.time.mfu},
            "measured": {"step_s": plan.time.step_s * step, "peak": peak * memory},
            "ratios": {"step_s": step, "peak": memory}}
