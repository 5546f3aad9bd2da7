"""A Core SELECT run through psycopg's own cursor: for the statements the API runs on every request.

`Connection.execute` costs about as much CPU again as the statement's round trip to PostgreSQL: the
statement's cache key, an execution context, bind processing, a result's metadata from the cursor's
description and a processed `Row` per row. For a list page of 50 jobs (`list_job_rows`), reading the
same compiled statement through the driver's cursor took 120 to 190 us less of a 470 to 660 us read,
page validation and encoding included (timeit on PostgreSQL 15, psycopg 3.3, SQLAlchemy 2.1).

`DriverSelect` keeps what SQLAlchemy contributes that the result depends on: the statement is compiled
by the engine's dialect once, expanding parameters (`IN` lists) are rendered by SQLAlchemy's own
`construct_expanded_state`, and every bound value goes through its type's bind processor (an enum's
stored string, a `TypeDecorator`'s own processing). A statement whose parameters SQLAlchemy would
rename or render into the SQL (escaped names, literal-execute values) is not taken (`for_dialect`
gives None). An error, a refused value's or the driver's, goes through the connection's own handling
of one, so it is raised as `execute` raises it (`StatementError`, or `DBAPIError` after the
`handle_error` events), and a lost connection invalidates the pool's older connections as well as its
own.

What it does not do is process the *results*: each row is a named tuple of the values as psycopg
reads them, so an enum column gives its stored string (an `Enum` column's value: a `StrEnum` equals
it) and a time comes in the session's zone, which `driver_reads` requires to be UTC (as
`make_engine`'s sessions are) so that it is what `UtcDateTime` would have made of it. It would not
fire the cursor events either, so a connection with listeners for them is not read through it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any, NamedTuple

from sqlalchemy import Connection, Select
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler


def driver_reads(conn: Connection) -> bool:
    """Whether `DriverSelect` should read on `conn`: PostgreSQL through psycopg (3), whose cursors
    take `%(name)s` parameters from a dict, in a session whose time zone is UTC (psycopg then reads
    times with `datetime.UTC`, as `UtcDateTime` gives them), with nothing listening for the cursor's
    execution on the connection or its engine (instrumentation, a statement log): those see every
    statement through `Connection.execute` instead."""
    dialect = conn.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg" \
            or conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute:
        return False
    dbapi_connection = conn.connection.dbapi_connection
    return dbapi_connection is not None and dbapi_connection.info.timezone is UTC


@dataclass(frozen=True, slots=True)
class DriverSelect:
    """`statement` compiled for a dialect (`for_dialect`), with its bind processors and a row type."""

    compiled: SQLCompiler
    processors: Mapping[str, Callable[[Any], Any]]
    row: Callable[..., tuple[Any, ...]]

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def for_dialect(statement: Select[Any], dialect: Dialect) -> DriverSelect | None:
        """`statement` compiled once for `dialect`, remembered by the statement's identity: give it
        statements built once (as `jobs._page_statements` builds them), not one per request. None for a
        statement with a parameter SQLAlchemy would rename in the SQL (a name with characters the
        driver's format does not take) or render into it (`literal_execute`): run it with `execute`."""
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        if compiled.escaped_bind_names or compiled.literal_execute_params:
            return None
        processors = {}
        for name, bind in compiled.binds.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = process
        names = list(statement.selected_columns.keys())
        row: type[tuple[Any, ...]] = NamedTuple("DriverRow", [(str(name), Any) for name in names])  # type: ignore[misc]
        return DriverSelect(compiled, processors, row._make)

    def rows(self, conn: Connection, values: Mapping[str, Any]) -> list[Any]:
        """Every row for `values` (a value for each bind parameter that has none of its own) as named
        tuples of the selected columns' names, read on `conn`'s DBAPI connection in its transaction
        state (`one_statement`'s autocommit, say). Raises `StatementError` for a value missing or one
        its type refuses, before anything reaches the database, and `DBAPIError` for the driver's
        errors, as `execute` does (`connection_invalidated` when the connection is gone)."""
        statement, params, cursor = self.compiled.string, dict(values), None
        try:
            state = self.compiled.construct_expanded_state(params)
            processors = {**self.processors, **state.processors} if state.processors else self.processors
            statement = state.statement
            params = {name: process(value) if (process := processors.get(name)) is not None else value
                      for name, value in state.parameters.items()}
            dbapi_connection = conn.connection.dbapi_connection
            assert dbapi_connection is not None
            cursor = dbapi_connection.cursor()
            cursor.execute(statement, params)
            return list(map(self.row, cursor.fetchall()))
        except Exception as exc:
            # What `execute` does with an error (SQLAlchemy's own, not public): a value missing or
            # refused by its type becomes a `StatementError`; a driver's error runs the `handle_error`
            # events and becomes a `DBAPIError`, and a lost connection invalidates this connection and
            # the pool's older ones (after a database restart one request fails, not one per pooled
            # connection). test_driver_select pins the parts this relies on.
            conn._handle_dbapi_exception(exc, statement, params, cursor, None)
        finally:
            if cursor is not None:
                cursor.close()
