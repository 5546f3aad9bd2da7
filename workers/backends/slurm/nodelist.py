"""Slurm's compressed node lists (`node[1-3,5],gpu07`): expanding them and judging whether one is complete."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

_GROUP = re.compile(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*")
_PART = re.compile(r"([^\[]*)(?:\[([^\]]*)\])?")


def expand_nodelist(nodelist: str) -> list[str]:
    """`node[1-3,5],gpu07` -> `['node1', 'node2', 'node3', 'node5', 'gpu07']`, zero padding kept.

    `None assigned` (a job that never got nodes) and the empty string give `[]`.
    """
    return list(_expanded(nodelist))


@lru_cache(maxsize=8192)  # a cycle sees the same few lists for thousands of jobs (sacct and squeue each)
def _expanded(nodelist: str) -> tuple[str, ...]:
    if not nodelist or nodelist.startswith("None"):
        return ()
    hosts: list[str] = []
    for group in _GROUP.findall(nodelist):
        prefixes = [""]
        for literal, ranges in _PART.findall(group):
            prefixes = [p + literal for p in prefixes]
            if ranges:
                suffixes: list[str] = []
                for part in ranges.split(","):
                    low, _, high = part.partition("-")
                    if high:
                        suffixes += [f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1)]
                    else:
                        suffixes.append(part)
                prefixes = [p + s for p in prefixes for s in suffixes]
        hosts += prefixes
    return tuple(hosts)


def fuller(accounted: str, current: str) -> str:
    """The longer of sacct's and squeue's node lists (sacct's on a tie). Each is short for a moment:
    squeue drops each node that has finished its epilog while a job completes, and sacct first
    records a just-finished job on its batch host alone (NNodes already says how many it had)."""
    return current if len(expand_nodelist(current)) > len(expand_nodelist(accounted)) else accounted


def nodes_complete(record: Mapping[str, str]) -> bool:
    """The record (`NodeList`, `NNodes`) lists as many nodes as it says the job had. A job that never
    got nodes (`None assigned`) or an unknown count is complete: only a partly recorded list is not."""
    count, nodes = record.get("NNodes", ""), expand_nodelist(record["NodeList"])
    return not count.isdigit() or not nodes or len(nodes) >= int(count)
