"""The top-kernel table's subcategories: the same labels as the case-insensitive patterns they replaced."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from service.profiles.classify import EventClass, subcategory

# The patterns `subcategory` used until 2026-12-06, kept as its specification: the first that matches.
PATTERNS = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|cublas|xmma|sm\d+_|matmul|^aten::(mm|addmm|bmm|linear)$", re.I)),
    ("conv", re.compile(r"conv", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|^aten::(add|mul|sub|div|gelu|relu)", re.I)),
    ("reduction", re.compile(r"reduce_kernel|reduction|layer_norm|softmax|^aten::(sum|mean)", re.I)),
    ("copy", re.compile(r"copy|CatArrayBatched|index|scatter|gather|^Memcpy|^Memset", re.I)),
)
FIXTURES = Path(__file__).parent / "fixtures"

# Names that sit on each rule's edges: case, anchors, a whole name against a longer one.
EDGES = [
    "ampere_sgemm_128x64_nn", "SM80_XMMA_GEMM_f16", "sm_80", "sm90a_", "Sm90_kernel", "aten::mm", "ATEN::MM",
    "aten::mm_", "aten::addmm", "aten::linear", "aten::linear_backward", "x aten::mm", "aten::add_", "aten::addcmul",
    "aten::Add", "my aten::add", "aten::sum", "aten::summary", "aten::mean", "Memcpy HtoD (Pageable -> Device)",
    "memset", "cudaMemcpyAsync", "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>",
    "void at::native::reduce_kernel<512, 1>", "cunn_SoftMaxForward", "LayerNorm", "layer_norm", "CatArrayBatchedCopy",
    "indexSelectLargeIndex", "scatter_gather_elementwise_kernel", "flash_fwd_kernel", "FMHA", "sdpa_math",
    "implicit_convolve_sgemm", "cudnn::conv", "nchwToNhwcKernel", "ProfilerStep#3", "", "aten::div", "aten::gelu",
    "aten::relu_", "aten::sub", "aten::mul", "Attention", "matmul", "cublasLt", "cutlass_80_tensorop",
]


def reference(name: str) -> str:
    return next((label for label, rx in PATTERNS if rx.search(name)), "other")


def trace_names() -> set[str]:
    """Every event name in the repository's trace fixtures."""
    names: set[str] = set()
    for path in FIXTURES.rglob("*.json*"):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            data = json.load(fh)
        events = data.get("traceEvents", []) if isinstance(data, dict) else data
        names.update(e["name"] for e in events if isinstance(e, dict) and isinstance(e.get("name"), str))
    return names


def test_subcategory_agrees_with_the_patterns_on_every_fixture_name_and_the_edges() -> None:
    names = trace_names() | set(EDGES)
    assert len(names) > 200  # the fixtures were read
    differ = {n: (subcategory(n, EventClass.compute), reference(n)) for n in names
              if subcategory(n, EventClass.compute) != reference(n)}
    assert not differ
    labels = {reference(n) for n in names}
    assert labels == {"attention", "gemm", "conv", "elementwise", "reduction", "copy", "other"}  # every rule tried
