"""Out of memory in the runtime (`workers.runtime.memory_budget`): a CPU rank over its per-process budget
fails the way a full GPU does (`torch.OutOfMemoryError`), and what it measured (class, peak, limit) reaches
the dispatcher through the one line the runtime prints, whatever the backend. The runtime's own report
of a real run over its budget is checked end to end in `tests/dispatch/test_oom_replan.py`."""

from __future__ import annotations

import pytest
import torch

from service.failures import FailureClass, MeasuredOom, measured_oom, oom_line
from workers.backends.evidence import memory_failure, program_lines
from workers.runtime.memory_budget import MemoryBudget, MemoryBudgetExceeded, measured_of, parse_bytes


def train_step(model: torch.nn.Module, batch: int) -> None:
    x = torch.randn(batch, 256)
    model(x).square().sum().backward()


def test_a_cpu_rank_over_its_budget_runs_out_of_memory_as_a_gpu_does() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    budget = MemoryBudget(1_000_000)  # parameters: 2 x (256 x 256 + 256) x 4 bytes, about 0.53 MB
    budget.register(model.parameters())
    assert 500_000 < budget.held < 600_000
    with pytest.raises(torch.OutOfMemoryError) as caught, budget:  # the class a CUDA allocator raises
        train_step(model, 512)  # activations of 512 x 256 x 4 bytes (0.5 MB) each pass the budget
    exc = caught.value
    assert isinstance(exc, MemoryBudgetExceeded)
    assert exc.peak_bytes > 1_000_000 and exc.limit_bytes == 1_000_000
    measured = measured_of(exc, rank=1, device=torch.device("cpu"))
    assert measured is not None
    assert (measured.failure, measured.rank, measured.peak_bytes, measured.limit_bytes) == (
        FailureClass.OOM_GPU, 1, exc.peak_bytes, 1_000_000)


def test_within_its_budget_a_rank_trains_and_freed_tensors_are_given_back() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    budget = MemoryBudget(4_000_000)
    budget.register(model.parameters())
    with budget:
        for _ in range(3):  # the same step three times: what it frees is counted out again
            train_step(model, 16)
            model.zero_grad(set_to_none=True)
    assert budget.peak < 4_000_000
    assert budget.held <= budget.peak and budget.held < 1_000_000


def test_other_failures_are_not_out_of_memory_and_memoryerror_is_host_memory() -> None:
    assert measured_of(RuntimeError("gloo: connection closed"), 0, torch.device("cpu")) is None
    host = measured_of(MemoryError(), 2, torch.device("cpu"))
    assert host is not None and host.failure == FailureClass.OOM_HOST and host.peak_bytes > 0
    assert host.limit_bytes is None


def test_the_oom_line_carries_class_and_peak_through_a_log_tail() -> None:
    mine = MeasuredOom(failure=FailureClass.OOM_GPU, rank=1, peak_bytes=5_300_123, limit_bytes=5_200_000,
                       source="cpu memory budget, live tensor bytes")
    other = MeasuredOom(failure=FailureClass.OOM_GPU, rank=0, peak_bytes=5_250_000, limit_bytes=5_200_000)
    tail = "\n".join([
        "[node0]",
        "[rank1]:Traceback (most recent call last):",
        "[rank1]:workers.runtime.memory_budget.MemoryBudgetExceeded: CPU memory budget exceeded: ...",
        f"[rank0]:{oom_line(other)}",
        f"[rank1]:{oom_line(mine)}",
    ])
    assert program_lines(tail.splitlines())[-1].endswith(oom_line(mine))  # not taken for a launcher line
    assert measured_oom(tail) == mine.model_copy(update={"source": ""})  # the largest peak of any rank
    assert memory_failure(tail) == FailureClass.OOM_GPU
    assert measured_oom("[rank0]:RuntimeError: something else") is None


@pytest.mark.parametrize(("text", "expected"), [("64MiB", 64 * 2**20), ("1.5GiB", int(1.5 * 2**30)),
                                                 ("500MB", 500_000_000), ("5200000", 5_200_000)])
def test_budgets_are_read_in_bytes_or_with_a_unit(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "-5", "0", "12 furlongs", "MiB"])
def test_a_budget_that_is_not_a_size_names_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="KiB, MiB, GiB"):
        parse_bytes(text)
