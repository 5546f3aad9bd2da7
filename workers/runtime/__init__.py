"""The in-job runtime: apply a plan with torch.distributed, train, measure, profile, report.

Public API: `apply_plan` (wrap a model and optimizer per a plan), `build_mesh`,
`init_distributed`, `Decoder` (the reference model, built from a planner `ModelShape`), `UnsupportedLayout`.
The CLI is `python -m workers.runtime` (see `docs/runtime.md`). Imports torch.
"""

from workers.runtime.errors import UnsupportedLayout, WorldMismatch
from workers.runtime.mesh import Mesh, build_mesh, init_distributed, pick_device
from workers.runtime.model import Decoder
from workers.runtime.parallelize import Applied, apply_plan

__all__ = ["Applied", "Decoder", "Mesh", "UnsupportedLayout", "WorldMismatch", "apply_plan",
           "build_mesh", "init_distributed", "pick_device"]
