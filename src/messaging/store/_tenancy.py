"""Per-tenant read models: each tenant reads and writes physical copies of the declared tables.

The default tenant's read models are the declared ``Table`` objects under their own
names, so a single-tenant deployment keeps its tables. Every other tenant's are copies
made with ``Table.to_metadata`` under ``<tenant>__<name>`` (indexes and named
constraints are renamed the same way, since SQLite's index names are global). A
tenant's :class:`ReadModels` maps each declared table to its copy, and a
``before_execute`` listener on that tenant's engine rewrites every statement that names
a declared table (its columns included) to name the copy instead: handler code does
not change. Statements are translated once and cached by identity (the cache holds the
statement, so an id is never reused while its entry lives).

``text()`` cannot be rewritten: inside a consumer's transaction of a non-default tenant
it is refused with an error naming the statement. ``exec_driver_sql`` is never seen by
the listener (SQLAlchemy sends it straight to the driver) and must not name read models.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Column, Engine, MetaData, Table, event
from sqlalchemy.sql import ClauseElement, visitors
from sqlalchemy.sql.ddl import ExecutableDDLElement
from sqlalchemy.sql.elements import TextClause

from messaging._errors import ProjectionsError, RegistrationError

DEFAULT_TENANT = "default"
"""The tenant whose read models keep their declared names."""
SEPARATOR = "__"
"""Between the tenant and the declared name in a physical table name."""
MAX_NAME = 64
"""The longest table or index name MySQL accepts; enforced on both backends."""
CONSUMER_OPTION = "projections_consumer"
"""Execution option naming the consumer whose batch a connection is applying."""

TRANSLATES = "_projections_translates"
"""Marks the listener of :meth:`ReadModels.install`: plans learned through it already hold
the translated SQL, so it does not keep statements from being sent directly."""

_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_MAX_TRANSLATED = 1024


class UntranslatableStatement(ProjectionsError):
    """A consumer of a non-default tenant ran SQL text, which cannot be given its tables."""


def physical_name(tenant: str, name: str, version: int | None = None) -> str:
    """The name a tenant's copy of the table or index ``name`` has in the database; that
    of a version built beside the live one (:mod:`messaging.versions._versions`) starts
    with ``_v<version>__``, which no tenant's name can (tenants start with a letter or
    digit, declared names hold no separator)."""
    named = name if tenant == DEFAULT_TENANT else f"{tenant}{SEPARATOR}{name}"
    return named if version is None else f"_v{version}{SEPARATOR}{named}"


class ReadModels:
    """One tenant's physical read-model tables, and the translation of statements to them.

    Thread-safe: instances of one process share it across their worker threads.
    """

    def __init__(self, tenant: str, version: int | None = None) -> None:
        self.tenant = tenant
        self.version = version
        """The version whose tables these are, if not the live one's."""
        self._copies: dict[Table, Table] = {}
        self._lock = threading.Lock()
        self._translated: dict[int, tuple[ClauseElement, ClauseElement]] = {}

    @property
    def renames(self) -> bool:
        """Whether this tenant's tables are copies (every tenant but the default's live
        tables)."""
        return self.tenant != DEFAULT_TENANT or self.version is not None

    def physical(self, table: Table) -> Table:
        """This tenant's table for the declared ``table`` (the table itself for the
        default tenant); statements on this tenant's engine naming ``table`` are sent to
        it from now on. RegistrationError if it cannot be named within the limits."""
        if not self.renames:
            return table
        copy = self._copies.get(table)
        if copy is not None:
            return copy
        with self._lock:
            copy = self._copies.get(table)
            if copy is None:
                copy = self._copy(table)
                self._copies = {**self._copies, table: copy}
                self._translated = {}
        return copy

    def tables(self, tables: Iterable[Table]) -> list[Table]:
        """:meth:`physical` of each of the declared ``tables``, in order. RegistrationError
        for a declared name holding the separator: it could be another tenant's copy."""
        tables = list(tables)
        for table in tables:
            if SEPARATOR in table.name:
                raise RegistrationError(
                    f"read-model table {table.name!r}: {SEPARATOR!r} is reserved for tenants' "
                    f"copies ({physical_name('acme', 'stock')!r} is tenant 'acme''s "
                    "'stock'); rename the table"
                )
        return [self.physical(table) for table in tables]

    def _copy(self, table: Table) -> Table:
        if _TENANT_NAME.fullmatch(self.tenant) is None:
            raise RegistrationError(
                f"tenant {self.tenant!r} cannot name read-model tables: use letters, digits, "
                "'_' and '-' (starting with a letter or digit)"
            )
        if table.foreign_keys:
            raise RegistrationError(
                f"read-model table {table.name!r} has foreign keys, which tenant "
                f"{self.tenant!r}'s copy cannot keep: drop them from the declaration"
            )
        name = physical_name(self.tenant, table.name, self.version)
        convention: Any = table.metadata.naming_convention
        copy = table.to_metadata(MetaData(naming_convention=convention), name=name)
        names = [name]
        items: list[Any] = [*copy.indexes, *copy.constraints]
        for item in items:
            if isinstance(item.name, str):
                item.name = physical_name(self.tenant, item.name, self.version)
                names.append(item.name)
        too_long = [n for n in names if len(n) > MAX_NAME]
        if too_long:
            raise RegistrationError(
                f"tenant {self.tenant!r}: the name {too_long[0]!r} of its copy of read-model "
                f"table {table.name!r} is longer than {MAX_NAME} characters (MySQL's limit); "
                "shorten the tenant or the declared name"
            )
        return copy

    # -- statements ------------------------------------------------------------------------

    def translate(self, statement: Any, options: Mapping[str, Any]) -> Any:
        """``statement`` naming this tenant's tables instead of the declared ones.
        UntranslatableStatement for SQL text run in a consumer's batch (``options``
        name the consumer)."""
        if isinstance(statement, TextClause):
            consumer = options.get(CONSUMER_OPTION)
            if consumer is not None:
                raise UntranslatableStatement(
                    f"consumer {consumer!r} of tenant {self.tenant!r} ran SQL text "
                    f"({str(statement)[:200]!r}), which cannot be sent to the tenant's own "
                    "read-model tables: build the statement from the declared Table instead"
                )
            return statement
        if (
            not self._copies
            or not isinstance(statement, ClauseElement)
            or isinstance(statement, ExecutableDDLElement)
        ):
            return statement
        entry = self._translated.get(id(statement))
        if entry is not None and entry[0] is statement:
            return entry[1]
        translated = self._rewrite(statement)
        if len(self._translated) >= _MAX_TRANSLATED:
            self._translated = {}
        self._translated[id(statement)] = (statement, translated)
        return translated

    def _rewrite(self, statement: ClauseElement) -> ClauseElement:
        copies = self._copies
        replaced = False

        def replace(element: Any) -> Any:
            nonlocal replaced
            copy: Any
            if isinstance(element, Table):
                copy = copies.get(element)
            elif isinstance(element, Column) and isinstance(element.table, Table):
                table = copies.get(element.table)
                copy = None if table is None else table.c[element.key]
            else:
                return None
            replaced = replaced or copy is not None
            return copy

        rewritten: ClauseElement = visitors.replacement_traverse(statement, {}, replace)  # type: ignore[call-overload]
        return rewritten if replaced else statement

    def install(self, engine: Engine) -> None:
        """Translate every statement run on ``engine`` (a no-op for the default tenant)."""
        if not self.renames:
            return

        def before_execute(
            conn: Any, statement: Any, multiparams: Any, params: Any, options: Any
        ) -> tuple[Any, Any, Any]:
            return self.translate(statement, options), multiparams, params

        setattr(before_execute, TRANSLATES, True)
        event.listen(engine, "before_execute", before_execute, retval=True)
