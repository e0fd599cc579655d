"""One shared database: engine set-up per backend, transactions, and schema preparation.

SQLite (file, WAL) is the embedded default; MySQL/MariaDB through PyMySQL is the
production backend. Write transactions on SQLite begin ``IMMEDIATE`` so that a
transaction that reads and then writes waits for the busy timeout instead of
failing at once with ``SQLITE_BUSY`` when another process wrote in between; a batch's
begins deferred instead, and takes the lock (:func:`take_write_lock`) when it first
sends its writes, so that its handlers run without it.
MySQL sessions run at READ COMMITTED so pollers never sit on an old snapshot; their lock
waits give up after half the answer bound, and an instance bounds them by its settings
(:meth:`Database.bound_lock_waits`); on MySQL its sessions are tracked
(:mod:`messaging.store._sessions`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Table, create_engine, event, insert, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError
from sqlalchemy.pool import NullPool

from messaging._bounds import answer_bound
from messaging._errors import ConfigError
from messaging._settings import ConflictRetrySettings
from messaging.store._answers import AnswerBound
from messaging.store._clock import Clock, DatabaseClock
from messaging.store._migrations import check_schema, create_sqlite_schema
from messaging.store._nodes import Failover, join_hosts, split_hosts
from messaging.store._retry import for_command, retry_command
from messaging.store._schema import Schema
from messaging.store._sessions import Sessions
from messaging.store._tenancy import CONSUMER_OPTION, ReadModels
from messaging.store._tls import SkipTlsWhereNone
from messaging.store._wakeup import APPENDED, WakeUps

SQLITE_BUSY_TIMEOUT = 30.0
"""Seconds a SQLite connection waits for another process's write lock, unless the URL
says otherwise (``sqlite:///app.db?timeout=5``)."""

_READ_ONLY = "projections_read_only"
_DEFERRED = "projections_deferred"
_UNWRITTEN = "projections_unwritten"
"""``connection.info`` of a SQLite transaction begun deferred that has not taken the write
lock (:func:`take_write_lock`): the connection's count of changed rows at its start."""
_LOCK_WAIT = "projections_lock_wait"


DEFAULT_ANSWER_TIMEOUT = answer_bound(30.0)
"""The answer bound of a :class:`Database` made without one: that of the default
stale-instance-timeout."""


def parse_database_url(url: str) -> URL:
    """Parse a database URL; :class:`ConfigError` says in one line what is wrong with it
    (not a URL at all, e.g. a bare path; a port that is not a number from 1 to 65535). A
    MySQL URL may name several nodes of a cluster (``mysql://u@h1:3306,h2:3306/db``, see
    :mod:`messaging.store._nodes`): the result names the first."""
    if "://" not in url:
        raise ConfigError(
            f"invalid database URL {url!r}: expected a URL such as sqlite:///path/to/app.db "
            "or mysql://user@host/db"
        )
    url, nodes = split_hosts(url)
    try:
        parsed = make_url(url)
        port = parsed.port
    except ArgumentError as exc:
        raise ConfigError(f"invalid database URL {url!r}: {exc}") from None
    except ValueError:  # int() of the port
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"invalid database URL {url!r}: the port must be a number 1-65535")
    if nodes and parsed.get_backend_name() not in ("mysql", "mariadb"):
        raise ConfigError(f"invalid database URL {url!r}: only MySQL/MariaDB takes several hosts")
    return parsed


def _normalize_url(url: str) -> str:
    parsed = parse_database_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigError(
                "database: SQLite needs a file (sqlite:///path.db); "
                "an in-memory database cannot be shared between processes"
            )
        return url
    if backend in ("mysql", "mariadb"):
        if not parsed.database:
            raise ConfigError(
                f"invalid database URL {parsed.render_as_string()!r}: it names no database "
                "(schema); add one after the host, e.g. mysql://user@host:3306/app"
            )
        driver = parsed.get_driver_name()
        if driver not in ("pymysql", "mysqldb") or "+" not in parsed.drivername:
            parsed = parsed.set(drivername=f"{backend}+pymysql")
        return join_hosts(parsed.render_as_string(hide_password=False), split_hosts(url)[1])
    raise ConfigError(f"database: unsupported backend {backend!r}; use sqlite:/// or mysql://")


def _sqlite_engine(url: str, pool: bool) -> Engine:
    # A ``?timeout=SECONDS`` in the URL sets the busy timeout; connect_args would override it.
    busy = {} if "timeout" in make_url(url).query else {"timeout": SQLITE_BUSY_TIMEOUT}
    engine = create_engine(
        url,
        connect_args={**busy, "check_same_thread": False},
        **({} if pool else {"poolclass": NullPool}),
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so that BEGIN is ours to issue.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        options = connection.get_execution_options()
        if options.get(_READ_ONLY):
            connection.exec_driver_sql("BEGIN")
        elif options.get(_DEFERRED):
            connection.exec_driver_sql("BEGIN")
            connection.info[_UNWRITTEN] = _changes(connection)
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _mysql_engine(
    url: str, pool: bool, answers: AnswerBound, failover: Failover | None, *, follow: bool = False
) -> Engine:
    """An engine for ``url``, connecting through ``failover`` where it has a node list:
    leading it, or (``follow``) only to the node its leader uses now."""
    # Every transaction here ends in a commit or rollback of its own, so the pool need not
    # send another on return; a connection the server dropped fails its first statement,
    # which is a transient error the callers retry, so no ping before each use either.
    engine = create_engine(
        split_hosts(url)[0],
        isolation_level="READ COMMITTED",
        pool_reset_on_return=None,
        pool_recycle=3600,
        connect_args={"charset": "utf8mb4"},
        paramstyle="format",
        # Keep what the lanes use open rather than reconnecting per batch: the instance
        # row records its sessions at each heartbeat (see messaging.store._sessions).
        **({"pool_size": 16} if pool else {"poolclass": NullPool}),
    )
    answers.install(engine)  # first: the listeners below connect with its parameters
    if failover is not None:
        (failover.follow if follow else failover.install)(engine)
    else:
        SkipTlsWhereNone().install(engine)
    return engine


class Database:
    """The shared database of one deployment: engine, tables, tenant and clock."""

    def __init__(
        self,
        url: str,
        *,
        tenant: str = "default",
        table_prefix: str = "prj_",
        clock: Clock | None = None,
        pool: bool = True,
        answer_timeout: float | None = DEFAULT_ANSWER_TIMEOUT,
        version: int | None = None,
    ) -> None:
        """``answer_timeout``: seconds a MySQL/MariaDB connection waits for its server to
        answer before it is taken for dead (None: for ever, as for a long migration). Its
        lock waits give up after half of that (1205), so that the server ends one first and
        it fails as a lock wait, not as a connection that stopped answering. ``version``:
        statements naming a declared read model go to that version's tables (built beside
        the live ones, :mod:`messaging.versions._versions`) instead of the live ones."""
        self.url = _normalize_url(url)
        backend = parse_database_url(self.url).get_backend_name()
        self.is_sqlite = backend == "sqlite"
        self._answers = AnswerBound(None if self.is_sqlite else answer_timeout)
        nodes = split_hosts(self.url)[1]
        self._failover = Failover(nodes) if nodes and not self.is_sqlite else None
        self.engine = (
            _sqlite_engine(self.url, pool)
            if self.is_sqlite
            else _mysql_engine(self.url, pool, self._answers, self._failover)
        )
        self.tenant = tenant
        self.schema = Schema(table_prefix)
        self.clock: Clock = clock or DatabaseClock(self.engine.dialect.name)
        self.read_models = ReadModels(tenant, version)
        """This tenant's physical read-model tables; statements on :attr:`engine` naming a
        declared table are sent to this tenant's copy (see :mod:`messaging.store._tenancy`)."""
        self.read_models.install(self.engine)
        self.wakeups = WakeUps(self._identity(table_prefix))
        """Same-host wake-ups: a commit that appended wakes the instances here at once."""
        self.commit_wakeups = WakeUps(self._identity(table_prefix) + "|batches")
        """Same-host wake-ups of the waits' watchers (:mod:`messaging.waits._watcher`) in
        other processes: each batch of a consumer that commits here wakes them at once."""
        self.after_batch: list[Callable[[], object]] = []
        """Called after each batch of a consumer commits through this object (the shared
        watcher of waits in this process)."""
        self.sessions = None if self.is_sqlite else Sessions(self.engine)
        """This process's MySQL sessions (None on SQLite)."""
        self.statements: dict[Hashable, Any] = {}
        """Statements built once for this database and shared by the stores of every
        instance on it, keyed by their builder: an instance started again in the process
        builds (and the driver fast path learns) none of them again."""
        self.lock_wait: float | None = None
        """Seconds a lock wait lasts at most, once :meth:`bound_lock_waits` set it."""
        if self._answers.seconds is not None:
            self.bound_lock_waits(self._answers.seconds / 2)

    @property
    def answer_timeout(self) -> float | None:
        """Seconds a MySQL/MariaDB connection waits for an answer (None: for ever, or SQLite):
        the bound asked for, or a Galera cluster's eviction time where longer (known once
        connected)."""
        return self._answers.longest

    def bound_answers(self, seconds: float) -> None:
        """Make MySQL/MariaDB connections give up on a server that does not answer within
        ``seconds`` (see :mod:`messaging.store._answers`); connections pooled before are
        closed. Nothing on SQLite: its database is a local file."""
        if self.is_sqlite or self._answers.seconds == seconds:
            return
        self._answers.seconds = seconds
        self.engine.dispose()

    def _identity(self, prefix: str) -> str:
        """The same string in every process on this host that shares these messages."""
        first = parse_database_url(split_hosts(self.url)[0])
        place = os.path.realpath(first.database or "") if self.is_sqlite else first.database
        return (
            f"{first.get_backend_name()}|{first.host}|{first.port}|{place}|{self.tenant}|{prefix}"
        )

    def bound_lock_waits(self, seconds: float) -> None:
        """Make every connection give up waiting for a lock after ``seconds``:
        ``innodb_lock_wait_timeout`` on MySQL (whole seconds, rounded up), the busy
        timeout on SQLite. Set on each connection when it is next checked out."""
        if self.lock_wait is None:
            event.listen(self.engine, "checkout", self._bound_lock_wait)
        self.lock_wait = seconds

    def _bound_lock_wait(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.get(_LOCK_WAIT) == self.lock_wait or self.lock_wait is None:
            return
        cursor = dbapi_connection.cursor()
        if self.is_sqlite:
            cursor.execute(f"PRAGMA busy_timeout = {int(self.lock_wait * 1000)}")
        else:
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {math.ceil(self.lock_wait)}")
        cursor.close()
        record.info[_LOCK_WAIT] = self.lock_wait

    def read_model(self, table: Table) -> Table:
        """This tenant's physical table for the declared read-model ``table``: the table
        itself for the default tenant, ``<tenant>__<name>`` for any other."""
        return self.read_models.physical(table)

    @contextmanager
    def transaction(
        self, *, consumer: str | None = None, deferred: bool = False
    ) -> Iterator[Connection]:
        """A write transaction: committed on success, rolled back on any exception; after
        a commit that appended messages, the instances on this host are woken.
        ``consumer``: the batch of that consumer, in which SQL text is refused for a
        tenant whose tables are renamed (it could not be sent to them). ``deferred``: on
        SQLite, it reads without the write lock until :func:`take_write_lock` (a batch's
        handlers run meanwhile) or its first write; elsewhere no difference."""
        info = None
        try:
            with self.engine.connect() as connection:
                if deferred and self.is_sqlite:
                    connection.execution_options(**{_DEFERRED: True})
                if consumer is not None and self.read_models.renames:
                    connection.execution_options(**{CONSUMER_OPTION: consumer})
                with connection.begin():
                    info = connection.info
                    try:
                        yield connection
                    finally:
                        info.pop(_UNWRITTEN, None)
        except BaseException:
            if info is not None:
                info.pop(APPENDED, None)
            raise
        if info is not None and (appended := info.pop(APPENDED, None)):
            self.wakeups.notify(appended)
        if consumer is not None:
            self.commit_wakeups.notify()
            for hook in self.after_batch:
                hook()

    def commit_and_read_on(self, conn: Connection) -> None:
        """On SQLite, in a batch's transaction (begun ``deferred``) that has taken the
        write lock: commit, and go on in a new deferred transaction (reading without the
        lock until :func:`take_write_lock`). A commit between two messages of a batch."""
        conn.exec_driver_sql("COMMIT")
        conn.exec_driver_sql("BEGIN")
        conn.info[_UNWRITTEN] = _changes(conn)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A short read-only transaction (deferred on SQLite, READ COMMITTED on MySQL)."""
        with self.engine.connect() as connection:
            connection = connection.execution_options(**{_READ_ONLY: True})
            with connection.begin():
                yield connection

    def prepare(self, *, reads_only: bool = False) -> None:
        """Make the schema ready: created on SQLite, checked on MySQL. Each step is
        idempotent, so a transient error (a lost connection, a Galera node leaving) retries,
        within a one-shot command's budget (:func:`~messaging.store._retry.retry_command`:
        :class:`~messaging._errors.Unanswered` when the database does not answer).
        ``reads_only``: for a command that only reads (a report): one answer bound."""

        def attempt() -> None:
            if self.is_sqlite:
                create_sqlite_schema(self)
            else:
                check_schema(self)
            self.ensure_tenant()

        retry_command(
            attempt,
            self,
            for_command(ConflictRetrySettings()),
            what="prepare",
            reads_only=reads_only,
        )

    def ensure_tenant(self) -> None:
        """Create this tenant's position counter and generation (see
        :mod:`messaging.distribution._pulse`) if they do not exist yet (looked for first
        without a write transaction: a crowd of instances starting takes no lock here)."""
        counters = (
            (self.schema.positions, "last_position"),
            (self.schema.generations, "generation"),
        )

        def missing(conn: Connection) -> list[tuple[Table, str]]:
            mine = [
                (t, c, select(t.c.tenant).where(t.c.tenant == self.tenant)) for t, c in counters
            ]
            return [(t, c) for t, c, row in mine if conn.execute(row).first() is None]

        with self.read() as conn:
            if not missing(conn):
                return
        with self.transaction() as conn:
            for table, column in missing(conn):
                try:
                    with conn.begin_nested():
                        conn.execute(insert(table).values(tenant=self.tenant, **{column: 0}))
                except IntegrityError:
                    pass  # another process created it first

    def for_version(self, version: int) -> Database:
        """Another engine on this database, tenant and clock whose statements naming a
        declared read model go to ``version``'s tables."""
        sibling = Database(
            self.url,
            tenant=self.tenant,
            table_prefix=self.schema.prefix,
            clock=self.clock,
            answer_timeout=self._answers.seconds,
            version=version,
        )
        if self.lock_wait is not None:
            sibling.bound_lock_waits(self.lock_wait)
        return sibling

    def unpooled_engine(self) -> Engine:
        """A new MySQL engine set up like :attr:`engine` but without a pool: each connection
        it opens is new and kept apart (the liveness lock's, :mod:`messaging.store._liveness`),
        never one the pool found dead; with a node list, to the node the pool uses."""
        return _mysql_engine(self.url, False, self._answers, self._failover, follow=True)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    @property
    def safe_url(self) -> str:
        """:attr:`url` with its password hidden (for messages)."""
        first, nodes = split_hosts(self.url)
        return join_hosts(make_url(first).render_as_string(hide_password=True), nodes)

    def __repr__(self) -> str:
        return f"Database({self.safe_url!r}, tenant={self.tenant!r})"


def take_write_lock(conn: Connection) -> None:
    """Make ``conn``'s transaction a writing one now if it began deferred (on SQLite:
    :meth:`Database.transaction`) and has not written yet: its read ends (nothing written
    to commit) and it waits for the write lock (``BEGIN IMMEDIATE``, within the busy
    timeout), rather than risk a write refused at once for a snapshot gone stale. Nothing
    to do otherwise."""
    unwritten = conn.info.pop(_UNWRITTEN, None)
    if unwritten is None or _changes(conn) != unwritten:
        return  # not deferred, or its first write took the lock already
    conn.exec_driver_sql("COMMIT")
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def reads_unlocked(conn: Connection) -> bool:
    """Whether ``conn``'s transaction began deferred and has not taken the write lock by
    :func:`take_write_lock` (a write of its own may have, by upgrading its read)."""
    return _UNWRITTEN in conn.info


def _changes(conn: Connection) -> int:
    """The rows a SQLite connection changed since it opened (``total_changes``)."""
    raw: Any = conn.connection.dbapi_connection
    return int(raw.total_changes)
