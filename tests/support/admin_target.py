"""A running instance of the ledger example (and a consumer with an awkward name) with its
admin server: the target of the attacks in tests/security."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
from admin_client import TOKEN_CONFIG, serve
from clusters import lag, wait_until, write_config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from messaging import Database, Instance, MessageStore, collect_consumers, create_plugin_manager
from messaging._config import load_settings
from messaging._settings import Settings
from messaging.store._migrations import migrate
from projections._admin import make_server
from projections._admin_http import BoundedHTTPServer
from projections._operations import audit_log
from projections._reports import consumers_report
from projections.examples import ledger

TARGET = "ledger-balances"


@attrs.define
class LiveAdmin:
    """An instance applying the ledger, and its admin server at ``base``."""

    base: str
    db: Database
    settings: Settings
    server: BoundedHTTPServer

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def snapshot(self) -> dict[str, Any]:
        """What an attack must not change: every consumer's state and partition epochs,
        and the audit."""
        report = consumers_report(self.db, self.settings.messaging.consumer)
        return {
            "consumers": {
                c["name"]: (c["state"], [p["epoch"] for p in c["partitions"]])
                for c in report["consumers"]
            },
            "audit": audit_log(self.db),
        }

    def settle(self) -> None:
        """Wait until every partition is owned again (after a command fenced them)."""

        def owned() -> bool:
            report = consumers_report(self.db, self.settings.messaging.consumer)
            return all(p["state"] == "OWNED" for c in report["consumers"] for p in c["partitions"])

        wait_until(owned, timeout=30, what="the instance to own every partition again")

    def baseline(self) -> dict[str, Any]:
        """The :meth:`snapshot` once every partition is owned: what an attack must leave."""
        self.settle()
        return self.snapshot()

    def append(self, seed: int, count: int) -> None:
        """Append about ``count`` messages of ledger traffic."""
        store = MessageStore(self.db)
        with self.db.transaction() as conn:
            for command in ledger.traffic(seed, count, accounts=20, prefix=f"s{seed}-"):
                for source, event in command:
                    store.append(conn, ledger.TOPIC, source, [event])


@contextmanager
def scratch_database(sibling_of: str, name: str) -> Iterator[str]:
    """A MySQL database ``name`` of its own on the server of URL ``sibling_of`` (read
    models are not tenant-scoped: two targets must not share one); dropped afterwards."""
    url = make_url(sibling_of)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()


@contextmanager
def live_admin(
    tmp: Path,
    *,
    token: bool,
    url: str | None = None,
    request_timeout: float = 10.0,
    max_threads: int = 16,
) -> Iterator[LiveAdmin]:
    """A caught-up instance and its admin server, with or without the test token, on the
    database ``url`` (default: a SQLite file in ``tmp``)."""
    db = Database(url or f"sqlite:///{tmp}/target.db", table_prefix="prj_")
    if not db.is_sqlite:
        migrate(db)
    db.prepare()
    config = write_config(tmp / "config.yaml", db, extra=TOKEN_CONFIG if token else "")
    settings = load_settings(str(config), environ={})
    manager = create_plugin_manager(
        ["projections.examples.ledger", "odd_names_app"], load_entrypoints=False
    )
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="target")
    instance.start()
    server = None
    try:
        server = make_server(
            db, settings, "127.0.0.1", 0, request_timeout=request_timeout, max_threads=max_threads
        )
        base, thread = serve(server)
        live = LiveAdmin(base=base, db=db, settings=settings, server=server)
        live.append(1, 60)
        wait_until(lambda: lag(db) == 0, timeout=30, what="the instance to apply the traffic")
        yield live
        server.shutdown()
        thread.join()
    finally:
        if server is not None:
            server.server_close()
        instance.stop()
        db.dispose()
