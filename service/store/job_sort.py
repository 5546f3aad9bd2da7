"""The orders a job list can be read in, and the cursors that page through them.

A sort is a column and a direction, written as the API and the dashboard take it: `gpus` is
ascending, `-gpus` descending. Every sort breaks ties by the job id in the same direction, so the
order is total and a keyset page (`WHERE (column, id) > (last column value, last id)`, never OFFSET)
returns each matching row exactly once however deep it is. Migration 0007 gives each sort its
`(column, id)` index, and a `(team_id, column, id)` one for members and the team filter.

Orders: `submitted` is the job id (ids grow with submission); `status` and `name` are the stored text
in the database's collation; `team` the team's name; `gpus` the GPUs (CPU slots) the plan needs;
`finished` the finish time, where a job that has not finished counts as later than every one that has
(so it comes last ascending, first descending).

A cursor names its sort: one from another sort is refused (`BadCursor`) instead of quietly starting
somewhere else. The default sort's cursor is the bare job id, as it always was for `GET /v1/jobs`;
every other one is an opaque URL-safe token.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, get_args

from sqlalchemy import ColumnElement, UnaryExpression, bindparam, tuple_
from sqlalchemy.orm import InstrumentedAttribute

from service.store.models import Job, Team
from service.store.vocab import JobStatus

#: Every value `sort` takes, for the API's and the dashboard's validation (and their error messages).
SortText = Literal["-submitted", "submitted", "-status", "status", "-team", "team", "-gpus", "gpus",
                   "-name", "name", "-finished", "finished"]
SORT_TEXTS: tuple[str, ...] = get_args(SortText)


class SortField(StrEnum):
    SUBMITTED = "submitted"
    STATUS = "status"
    TEAM = "team"
    GPUS = "gpus"
    NAME = "name"
    FINISHED = "finished"


class BadCursor(ValueError):
    """A cursor that is not one this list gave out for this sort; the message says what to do."""


@dataclass(frozen=True, slots=True)
class JobSort:
    field: SortField
    descending: bool

    @classmethod
    def parse(cls, text: str) -> JobSort:
        """`gpus` / `-gpus` as a sort; `ValueError` naming the allowed values otherwise."""
        if text not in SORT_TEXTS:
            raise ValueError(f"sort must be one of {', '.join(SORT_TEXTS)}, not {text!r}")
        return cls(SortField(text.removeprefix("-")), text.startswith("-"))

    @property
    def text(self) -> str:
        return ("-" if self.descending else "") + self.field.value

    def reversed(self) -> JobSort:
        return JobSort(self.field, not self.descending)


#: Newest first: what a list shows when no sort is asked for.
DEFAULT_SORT = JobSort(SortField.SUBMITTED, descending=True)

CursorValue = str | int | datetime | None


@dataclass(frozen=True, slots=True)
class JobCursor:
    """Where a page ended: the sort, the last row's sort value and its id. Rows after it come next."""

    sort: JobSort
    value: CursorValue
    id: int

    def encode(self) -> str:
        if self.sort == DEFAULT_SORT:
            return str(self.id)
        value = self.value.isoformat() if isinstance(self.value, datetime) else self.value
        raw = json.dumps([self.sort.text, value, self.id], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str, sort: JobSort) -> JobCursor:
        """The cursor `token` stands for; `BadCursor` if it is malformed or belongs to another sort."""
        if token.isdigit() and len(token) <= 18:
            if sort != DEFAULT_SORT:
                raise BadCursor(f"this cursor pages sort={DEFAULT_SORT.text}, not sort={sort.text}: pass the same"
                                " sort as the request that returned it, or drop the cursor to start again")
            return cls(sort, None, int(token))
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            sort_text, value, job_id = json.loads(raw)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise BadCursor("not a cursor this list gave out: pass next_cursor unchanged, or drop it to start"
                            " again") from exc
        if sort_text != sort.text:
            raise BadCursor(f"this cursor pages sort={sort_text}, not sort={sort.text}: pass the same sort as the"
                            " request that returned it, or drop the cursor to start again")
        if not isinstance(job_id, int) or not 1 <= job_id < 2**63:
            raise BadCursor("not a cursor this list gave out (its job id is out of range): drop it to start again")
        return cls(sort, _checked_value(sort.field, value), job_id)


def _checked_value(field: SortField, value: object) -> CursorValue:
    """The cursor's sort value as the column holds it; `BadCursor` when it cannot be one."""
    ok: CursorValue = None
    try:
        if field is SortField.SUBMITTED and value is None:
            return None
        if field is SortField.STATUS and isinstance(value, str):
            ok = JobStatus(value).value
        elif field in (SortField.TEAM, SortField.NAME) and isinstance(value, str) and len(value) <= 200:
            ok = value
        elif field is SortField.GPUS and isinstance(value, int) and not isinstance(value, bool):
            ok = value if 0 <= value < 2**31 else None
        elif field is SortField.FINISHED and (value is None or isinstance(value, str)):
            return None if value is None else datetime.fromisoformat(value)
    except ValueError:
        ok = None
    if ok is None:
        raise BadCursor(f"not a cursor of sort={field.value} (its value {value!r} cannot be one): drop it to start"
                        " again")
    return ok


def sort_column(field: SortField) -> InstrumentedAttribute[Any] | None:
    """The column a sort orders by before the id; None for `submitted` (the id itself)."""
    columns: dict[SortField, InstrumentedAttribute[Any]] = {
        SortField.STATUS: Job.status, SortField.TEAM: Team.name, SortField.GPUS: Job.gpus,
        SortField.NAME: Job.name, SortField.FINISHED: Job.finished_at}
    return columns.get(field)


def cursor_after(sort: JobSort, job: Job | Any, team: str) -> JobCursor:
    """The cursor of the page that ends with `job` (an ORM `Job` or a row of its columns, whose status
    may be the stored string) of `team`."""
    values: dict[SortField, CursorValue] = {
        SortField.SUBMITTED: None, SortField.STATUS: str(job.status), SortField.TEAM: team,
        SortField.GPUS: job.gpus, SortField.NAME: job.name, SortField.FINISHED: job.finished_at}
    return JobCursor(sort, values[sort.field], job.id)


Segment = tuple[list[ColumnElement[bool]], list[UnaryExpression[Any]]]

#: The bind parameters a segment's conditions read: the cursor's job id and sort value (`cursor_values`).
AFTER_ID, AFTER_VALUE = "after_id", "after_value"


class After(StrEnum):
    """What of a cursor shapes the statements of the page after it: none; one whose sort value is NULL
    (the default sort's bare id, or an unfinished job); one with a sort value."""

    START = "start"
    NULL_VALUE = "null_value"
    VALUE = "value"

    @classmethod
    def of(cls, cursor: JobCursor | None) -> After:
        if cursor is None:
            return cls.START
        return cls.NULL_VALUE if cursor.value is None else cls.VALUE


def cursor_values(cursor: JobCursor | None) -> dict[str, Any]:
    """The values of the bind parameters that `segments` reads, for the page after `cursor`."""
    return {} if cursor is None else {AFTER_ID: cursor.id, AFTER_VALUE: cursor.value}


def segments(sort: JobSort, after: After, *, teams: Sequence[tuple[int, str]] | None = None,
             cursor_team: str | None = None) -> list[Segment]:
    """The (conditions, order) queries that, read one after the other, give the rows after a cursor of
    shape `after` in `sort`'s order, each one range of one index. They read the cursor's id and value
    from bind parameters (`cursor_values`), so a page's statements can be built once per shape.

    One query for most sorts. `finished`: the jobs that have not finished (NULL) in a query of their
    own. `team`: with `teams` None the list is narrowed to one team (a member's, or the team filter),
    so the order is the id's; else `teams` are the (id, name) of the teams from the cursor's team
    (`cursor_team`) on, in the sort's order, and each is one query on `(team_id, id)` (a join sorted on
    the team's name would sort every matching job)."""
    desc = sort.descending
    by_id: list[UnaryExpression[Any]] = [Job.id.desc() if desc else Job.id.asc()]
    cursor_id = bindparam(AFTER_ID, type_=Job.id.type)
    after_id: list[ColumnElement[bool]] = [] if after is After.START else [
        Job.id < cursor_id if desc else Job.id > cursor_id]
    if sort.field is SortField.TEAM:
        if teams is None:
            return [(after_id, by_id)]
        return [([Job.team_id == team_id, *(after_id if name == cursor_team else [])], by_id)
                for team_id, name in teams]
    column = sort_column(sort.field)
    if column is None:
        return [(after_id, by_id)]
    order: list[UnaryExpression[Any]] = [column.desc(), Job.id.desc()] if desc else [column.asc(), Job.id.asc()]
    if sort.field is not SortField.FINISHED:
        return [([] if after is After.START else [_row_after(column, desc)], order)]
    known: list[ColumnElement[bool]] = [column.is_not(None)]
    unknown: list[ColumnElement[bool]] = [column.is_(None)]
    if after is After.START:
        parts: list[Segment] = [(unknown, by_id), (known, order)]
        return parts if desc else parts[::-1]
    if after is After.NULL_VALUE:  # ended among the unfinished jobs
        later = [*unknown, *after_id]
        return [(later, by_id), (known, order)] if desc else [(later, by_id)]
    later = [*known, _row_after(column, desc)]
    return [(later, order)] if desc else [(later, order), (unknown, by_id)]


def _row_after(column: InstrumentedAttribute[Any], desc: bool) -> ColumnElement[bool]:
    row = tuple_(column, Job.id)
    mark = tuple_(bindparam(AFTER_VALUE, type_=column.type), bindparam(AFTER_ID, type_=Job.id.type))
    return row < mark if desc else row > mark
