"""The public truth table (benchmarks/published/) and the script that scores the planner on it.

These check the data and the tooling, not the error goals: every row parses, names its source and
table, becomes a valid spec and a layout the planner evaluates; malformed data is refused with the
file, the row and the field; the script prints a line per measured row, a verdict per published
out-of-memory layout and the summaries, and exits 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.prediction_error import (
    FOLDER,
    DataError,
    Row,
    evaluate,
    load_rows,
    main,
    megatron_eq3_flops,
    spec_for,
)
from service.planner.search import resolve

ROWS = load_rows()


def test_every_row_has_a_source_the_readme_lists() -> None:
    readme = (FOLDER / "README.md").read_text(encoding="utf-8")
    assert len(ROWS) >= 20
    for row in ROWS:
        assert row.source.urls and row.where.strip(), row.id
        assert row.source.id in readme, f"README.md does not list source {row.source.id}"
        if row.outcome == "measured":
            step = row.published_step_s()
            assert step is not None and step > 0, row.id
    assert any(r.outcome == "oom" for r in ROWS), "the table has published out-of-memory layouts"


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_every_row_is_a_valid_spec_the_planner_evaluates(row: Row) -> None:
    spec = spec_for(row)
    ctx = resolve(spec)  # presets, the GPU and the pins resolve without a field problem
    assert ctx.cluster.world_size == row.gpus
    assert ctx.shape.layers == row.model.layers and ctx.shape.seq_len == row.model.seq_len
    result = evaluate(row)
    assert result.refused is None, result.refused
    assert result.plan is not None
    lay = result.plan.layout
    assert (lay.dp, lay.tp, lay.pp, lay.cp) == (row.layout.dp, row.layout.tp, row.layout.pp, row.layout.cp)
    assert lay.micro_batch * lay.grad_accum_steps * lay.dp == row.global_batch


def test_megatron_flops_conversion_reproduces_the_papers_aggregate_column() -> None:
    """Table 1 prints aggregate petaFLOP/s next to per-GPU teraFLOP/s; the step time derived from the
    per-GPU figure must give back the aggregate within the table's rounding."""
    aggregate = {"mlm21-gpt-1t": 502.0, "mlm21-gpt-530b": 410.2, "mlm21-gpt-1.7b": 4.4}
    for row in ROWS:
        if row.id in aggregate:
            step = row.published_step_s()
            assert step is not None
            pflops = megatron_eq3_flops(row.model, row.global_batch) / step / 1e15
            assert pflops == pytest.approx(aggregate[row.id], rel=0.01)


def _write(folder: Path, text: str) -> None:
    (folder / "data.yaml").write_text(text, encoding="utf-8")


SOURCE = """
source: {id: s, title: t, urls: ["https://example.org/t"], measured_on: x, figure: tokens_per_s_per_gpu,
         conversion: c, memory: not published}
models:
  m: {family: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 4, ffn_hidden: 128, vocab: 100, seq_len: 32}
defaults:
  gpu: {kind: H100-SXM-80GB}
  gpus_per_node: 8
  precision: bf16
  optimizer: adamw
  attention: flash
  layout: {sharding: fsdp, tp: 1, pp: 1, cp: 1, sequence_parallel: false, checkpointing: none}
"""


def test_malformed_rows_are_refused_naming_file_row_and_field(tmp_path: Path) -> None:
    _write(tmp_path, SOURCE + """
rows:
  - {id: r1, where: w, model: m, gpus: 8, global_batch: 8, micro_batch: 1, layout: {dp: 4},
     measured: {tokens_per_s_per_gpu: 10}}
""")
    with pytest.raises(DataError, match=r"data.yaml rows\[0\] \(r1\).*dp\*tp\*pp\*cp = 4 but gpus = 8"):
        load_rows(tmp_path)
    _write(tmp_path, SOURCE + """
rows:
  - {id: r1, where: w, model: nope, gpus: 8, global_batch: 8, micro_batch: 1, layout: {dp: 8}}
""")
    with pytest.raises(DataError, match=r"model 'nope' is not defined"):
        load_rows(tmp_path)
    _write(tmp_path, SOURCE.replace("source:", "ignored:") + """
rows:
  - {id: r1, where: w, model: m, gpus: 8, global_batch: 8, micro_batch: 1, layout: {dp: 8}, outcome: oom}
""")
    with pytest.raises(DataError, match="rows need a source"):
        load_rows(tmp_path)
    _write(tmp_path, SOURCE + """
rows:
  - {id: r1, where: w, model: m, gpus: 8, global_batch: 8, micro_batch: 1, layout: {dp: 8}}
""")
    with pytest.raises(DataError, match=r"exactly one of measured\.tokens_per_s_per_gpu"):
        load_rows(tmp_path)


def test_the_script_prints_each_row_the_oom_verdicts_and_the_summaries(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for row in ROWS:
        if row.outcome == "measured":
            assert any(line.startswith(row.id + " ") for line in lines), row.id
        else:
            verdict = next(line for line in lines if line.startswith(row.id + " "))
            assert "does not fit" in verdict or "fits (wrong)" in verdict
    oom = sum(r.outcome == "oom" for r in ROWS)
    assert "called 'does not fit': " in out and f" of {oom} (goal: all)" in out
    for label in ("Goal set:", "Outside the goal set:", "All rows:"):
        assert label in out
    assert "step time:" in out and "peak memory:" in out


def test_a_folder_without_data_exits_with_an_error_naming_it(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--folder", str(tmp_path)]) == 2
    assert "no *.yaml data files" in capsys.readouterr().err
