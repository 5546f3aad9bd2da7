"""Slurm's pending reason and start estimate, parsed from squeue output as Slurm 22.05 prints it with
`accounting.SQUEUE_FORMAT` (lines taken from the test cluster). Pure: no cluster needed."""

from __future__ import annotations

from datetime import datetime

from workers.backends.slurm.accounting import (
    SQUEUE_FORMAT,
    parse_squeue,
    parse_squeue_by_id,
    pending_details,
    start_time,
)

# squeue -h -t all -o SQUEUE_FORMAT, while job 193 held both nodes
OUTPUT = """\
191|sc-bp-fill|CANCELLED|node[1-2]|None|/tmp|2|2026-12-01T01:28:15
194|sc-bp-wait|PENDING||Resources|/tmp|2|2026-12-01T01:31:24
195|shardctl-smoke|PENDING||Priority|/tmp/ci1|2|N/A
193|sc-bp-fill|RUNNING|node[1-2]|None|/tmp|2|2026-12-01T01:28:24
196|shardctl-7-1|PENDING||BeginTime|/srv/slurm/shardctl-7-1|1|2026-12-01T02:00:00
197|shardctl-8-1|PENDING||QOSMaxGRESPerUser|/srv/slurm/shardctl-8-1|2|N/A
"""


def test_the_format_asks_for_the_reason_and_the_start_time() -> None:
    assert SQUEUE_FORMAT.split("|")[4] == "%r" and SQUEUE_FORMAT.endswith("|%S")


def test_the_reason_and_the_estimate_of_a_pending_job() -> None:
    by_id = parse_squeue_by_id(OUTPUT)
    assert pending_details(by_id["194"], None) == ("Resources", datetime(2026, 12, 1, 1, 31, 24).timestamp())
    assert pending_details(by_id["195"], None) == ("Priority", None)  # "N/A": no estimate yet
    assert pending_details(by_id["196"], None) == ("BeginTime", datetime(2026, 12, 1, 2).timestamp())
    assert pending_details(by_id["197"], None) == ("QOSMaxGRESPerUser", None)
    assert parse_squeue(OUTPUT)["sc-bp-wait"]["StartTime"] == "2026-12-01T01:31:24"


def test_sacct_speaks_when_squeue_does_not_know_the_job() -> None:
    sacct = [{"JobIDRaw": "9", "JobName": "shardctl-9-1", "State": "PENDING", "ExitCode": "0:0", "NodeList":
              "None assigned", "Reason": "Priority", "WorkDir": "/w", "NNodes": "1"}]
    assert pending_details(None, sacct) == ("Priority", None)
    assert pending_details(None, [{**sacct[0], "Reason": "None"}]) == (None, None)
    assert pending_details(None, None) == (None, None)


def test_start_times_that_are_no_time() -> None:
    for value in ("N/A", "Unknown", "", "None", "(null)", "not a time"):
        assert start_time(value) is None
    assert start_time("2026-12-01T01:31:24") == datetime(2026, 12, 1, 1, 31, 24).timestamp()  # local, as printed


def test_a_line_without_the_start_column_still_parses() -> None:
    record = parse_squeue_by_id("194|sc-bp-wait|PENDING||Resources|/tmp|2\n")["194"]
    assert record["StartTime"] == "" and pending_details(record, None) == ("Resources", None)
