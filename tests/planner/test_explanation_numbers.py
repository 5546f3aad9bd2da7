"""Every number a plan's words quote agrees with the plan's own fields (wrong ones seen: "+4% step time ...
(+3.4 s)" where 4% was 0.7 s, "1128.9 GB per GPU against 80.0 GiB", "over 1 GPUs", "Evaluated 1
layouts; rejected: 8 out of memory").

Many plans are rendered (the examples, one-GPU offload plans, plans that do not fit, small CPU
plans) and each sentence's numbers are parsed back and compared with the fields beside them, at
the precision the sentence prints.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from service.cli.render import considered_sentence, plan_line
from service.planner import Plan, plan
from service.planner.hardware import GIB
from service.spec import load_spec
from tests.conftest import make_spec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
SPECS = {
    "8b-on-8": {},
    "tiny-on-8": {"model": {"preset": "llama-tiny"}, "training": {"global_batch": 8}},
    "7b-on-1": {"model": {"preset": "llama-2-7b"}, "training": {"global_batch": 8},
                "resources": {"gpus_per_node": 1}},
    "70b-on-1": {"model": {"preset": "llama-2-70b"}, "training": {"global_batch": 8},
                 "resources": {"gpus_per_node": 1}},
    "405b-on-8-no-fit": {"model": {"preset": "llama-3.1-405b"}, "training": {"global_batch": 64}},
    "tiny-cpu-2": {"model": {"preset": "llama-tiny"}, "training": {"global_batch": 8, "precision": "fp32"},
                   "resources": {"gpu": "cpu", "gpus_per_node": 2}},
    "13b-on-16-a100": {"model": {"preset": "llama-2-13b"}, "training": {"global_batch": 32},
                       "resources": {"gpu": "A100-SXM-80GB", "nodes": 2}},
    "8b-eager-on-4": {"model": {"preset": "llama-3.1-8b", "seq_len": 4096},
                      "training": {"global_batch": 16, "attention": "eager"}, "resources": {"gpus_per_node": 4}},
    "70b-tp-pinned": {"model": {"preset": "llama-3.1-70b"}, "training": {"global_batch": 64},
                      "resources": {"nodes": 4}, "layout": {"tp": 8}},
}

PCT_AND_SECONDS = re.compile(
    r"(?:(?P<up>[+-]\d+(?:\.\d+)?)% step time|(?P<down>\d+(?:\.\d+)?)% faster) \((?P<s>[+-][0-9.e+-]+) s per step\)")
SAME = re.compile(r"the same step time within 0\.05% \((?P<s>[+-][0-9.e+-]+) s per step\)")
GIB_NUM = re.compile(r"(\d+(?:\.\d+)?) GiB")


@cache
def plans() -> dict[str, Plan]:
    out = {f"example:{p.stem}": plan(load_spec(p)) for p in EXAMPLES}
    out.update({name: plan(make_spec(**sections)) for name, sections in SPECS.items()})
    return out


def _close_printed(printed: str, value: float, sig: int = 3) -> bool:
    """`printed` is `value` at the precision it shows (three significant digits or its decimals)."""
    number = float(printed)
    decimals = len(printed.split(".")[1].split("e")[0]) if "." in printed else 0
    step = max(10 ** -decimals, abs(value) * 10 ** (1 - sig)) if "e" not in printed else abs(value) * 10 ** (1 - sig)
    return bool(abs(number - value) <= step + 1e-12)


def _sentences(p: Plan) -> list[str]:
    return [p.rubric, *p.explanation, *p.reasons, *p.warnings, *(a.why_not for a in p.alternatives),
            considered_sentence(p), plan_line(p)]


@pytest.mark.parametrize("name", [*(f"example:{p.stem}" for p in EXAMPLES), *SPECS])
def test_every_number_in_the_words_agrees_with_the_plan(name: str) -> None:
    p = plans()[name]
    text = "\n".join(_sentences(p))
    # One unit family: GiB (the papers' GB appear only in the docs).
    assert not re.search(r"\d GB\b", text), text
    # Plurals: never "1 layouts", "1 GPUs", never "2 layout".
    assert not re.search(r"\b1 (layouts|GPUs|meshes|fitting layouts)\b", text), text
    assert not re.search(r"\b(?:[02-9]|\d{2,}) (?:fitting )?(?:layout|GPU)\b(?!s)", text.replace(",", "")), text

    limit = p.memory.gpu_memory
    memory_line = next(x for x in p.explanation if x.startswith("Memory:"))
    used, of, pct = re.match(r"Memory: ([\d.]+) GiB of ([\d.]+) GiB per GPU \((\d+)%\)", memory_line).groups()  # type: ignore[union-attr]
    assert _close_printed(used, p.memory.total / GIB) and _close_printed(of, limit / GIB)
    assert int(pct) == round(100 * p.memory.total / limit)

    time_line = next(x for x in p.explanation if x.startswith("Time per step:"))
    for word, field in (("compute", "compute_s"), ("recompute", "recompute_s"),
                        ("exposed communication", "comm_exposed_s"), ("bubble", "bubble_s"),
                        ("optimizer", "optimizer_s"), ("offload", "offload_s")):
        printed = re.search(rf"\b{word} ([0-9.e+-]+) s", time_line).group(1)  # type: ignore[union-attr]
        assert _close_printed(printed, getattr(p.time, field)), (word, printed, getattr(p.time, field))

    for alt in p.alternatives:
        _check_comparison(alt.why_not, p.time.step_s, alt.step_s)
        if "of GPU memory" in alt.why_not:
            used_pct = re.search(r"uses (\d+)% of GPU memory", alt.why_not).group(1)  # type: ignore[union-attr]
            assert int(used_pct) == round(100 * alt.memory_total / limit)


def _check_comparison(words: str, chosen_s: float, other_s: float) -> None:
    """`+4.0% step time (+0.700 s per step)`: the seconds are the difference, the percentage is the
    seconds over the chosen step time, and the sign says which is faster."""
    delta = other_s - chosen_s
    same = SAME.search(words)
    if same:
        assert abs(delta) < 0.0005 * chosen_s and _close_printed(same.group("s"), delta)
        return
    m = PCT_AND_SECONDS.search(words)
    assert m, words
    assert _close_printed(m.group("s"), delta), (words, delta)
    pct = float(m.group("up")) if m.group("up") else -float(m.group("down"))
    assert abs(pct - 100 * delta / chosen_s) <= 0.05 + 1e-9, (words, delta / chosen_s)
    # The parts named: "mostly X (+a s)" only when a is more than half the difference.
    mostly = re.search(r"mostly [a-z ]+ \(([+-][0-9.e+-]+) s\)", words)
    if mostly:
        assert abs(float(mostly.group(1))) > 0.5 * abs(delta) * 0.999


@pytest.mark.parametrize("name", [*(f"example:{p.stem}" for p in EXAMPLES), *SPECS])
def test_the_decision_sentences_quote_the_layouts_they_name(name: str) -> None:
    p = plans()[name]
    for line in p.explanation:
        if line.startswith(("Headroom decided", "Simplicity decided")):
            other_short = re.search(r"decided: (?:the fastest fitting layout, )?(.+?),? is ", line).group(1)  # type: ignore[union-attr]
            other = next((a for a in p.alternatives if a.layout.short() == other_short.rstrip(",")), None)
            if other is not None:
                _check_comparison(line, p.time.step_s, other.step_s)
            assert PCT_AND_SECONDS.search(line) or SAME.search(line), line


@pytest.mark.parametrize("name", [*(f"example:{p.stem}" for p in EXAMPLES), *SPECS])
def test_the_count_of_layouts_adds_up(name: str) -> None:
    p = plans()[name]
    sentence = considered_sentence(p)
    numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", sentence)]
    total, rest = numbers[0], numbers[1:]
    r = p.rejected
    chosen = 1 if p.fits else 0
    if p.fits:
        chosen_n, slower, oom, dominated, invalid = rest
        assert chosen_n == 1
    else:
        slower, oom, dominated, invalid = rest
    assert (slower, oom, dominated, invalid) == (r.slower, r.out_of_memory, r.dominated, r.invalid)
    assert total == chosen + slower + oom + dominated
    first = p.explanation[0]
    fitting = re.search(r"chosen from (\d+) fitting layouts?", first)
    if fitting:
        assert 1 <= int(fitting.group(1)) <= 1 + r.slower
