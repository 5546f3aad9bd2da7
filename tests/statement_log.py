"""Which statements a request sends the database, as verb and table ("SELECT api_tokens")."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import event

from tests.db_fixtures import Env


def _record_into(seen: list[str]) -> Callable[..., None]:
    """A `before_cursor_execute` listener that appends each statement to `seen` as its verb and table
    ("SELECT teams", "INSERT jobs+events" for a data-modifying CTE), leaving out transaction control and
    the calibration read (read once per TTL)."""

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        inserts = re.findall(r"INSERT INTO (\w+)", statement)
        while "(" in statement:  # the top-level statement only: subqueries and column lists out
            statement = re.sub(r"\([^()]*\)", "", statement)
        words = statement.split()
        verb = words[0].upper()
        if verb in ("BEGIN", "COMMIT", "ROLLBACK") or "calibration_" in statement:
            return
        if verb == "WITH":  # one statement that inserts into several tables
            seen.append("INSERT " + "+".join(inserts))
            return
        table = words[words.index("INTO") + 1] if verb == "INSERT" else words[words.index("FROM") + 1]
        seen.append(f"{verb} {table.strip(chr(34))}")

    return record


@contextmanager
def statements(env: Env) -> Iterator[list[str]]:
    """While open, the statements the app's engine sends, in order (see `_record_into`)."""
    seen: list[str] = []
    record = _record_into(seen)
    event.listen(env.app.state.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(env.app.state.engine, "before_cursor_execute", record)
