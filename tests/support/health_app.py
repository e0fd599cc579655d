"""An application for the health tests: one projection whose messages say how their
handler fares: applied (``ok``), failing for ever (``poison``: the partition halts),
sleeping a while first (``slow``: after creating ``$HEALTH_DIR/slow-<pid>``), or ending
the thread that applies it (``fatal``: ``SystemExit``, as a loop that dies). Its
declaration's version comes from ``$HEALTH_VERSION`` (1), for rolling deploys."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import attrs
from clusters import wait_until
from sqlalchemy import BigInteger, Column, MetaData, Table, func, insert, select
from sqlalchemy.exc import OperationalError, ProgrammingError

from messaging import HandlerContext, MessageStore, handler, message
from messaging.store._database import Database
from projections import projection

TOPIC = "health"
CONSUMER = "health-tally"
SLOW_SECONDS = 3.0

metadata = MetaData()
applied_table = Table(
    "health_tally", metadata, Column("position", BigInteger, primary_key=True, autoincrement=False)
)


@message("test.health.counted")
@attrs.define(frozen=True)
class Counted:
    n: int
    fate: str = "ok"


@projection(
    CONSUMER,
    topics=TOPIC,
    partitions=4,
    tables=[applied_table],
    version=int(os.environ.get("HEALTH_VERSION", "1")),
)
class HealthTally:
    @handler
    def counted(self, event: Counted, ctx: HandlerContext) -> None:
        if event.fate == "poison":
            raise ValueError(f"message {event.n} is poison")
        if event.fate == "fatal":
            raise SystemExit(f"message {event.n} ends its loop")
        if event.fate == "slow":
            (Path(os.environ["HEALTH_DIR"]) / f"slow-{os.getpid()}").touch()
            time.sleep(SLOW_SECONDS)
        ctx.execute(insert(applied_table), {"position": ctx.envelope.position})


def append(db: Database, first: int, count: int, fate: str = "ok") -> None:
    """Append ``count`` messages numbered from ``first``, each of its own source (so they
    spread over the partitions), all with ``fate``."""
    store = MessageStore(db)
    with db.transaction() as conn:
        for n in range(first, first + count):
            store.append(conn, TOPIC, f"s{n}", [Counted(n, fate)])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, Any]:
    """(status, JSON body) of ``GET /admin/<path>`` on ``port``; (0, None) while nothing
    answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def applied(db: Database) -> int:
    """Messages in the read model (0 while it is not created, or being created again)."""
    try:
        with db.read() as conn:
            return int(conn.execute(select(func.count()).select_from(applied_table)).scalar_one())
    except (OperationalError, ProgrammingError):
        return 0


def health_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``projections health ARGS --config CONFIG`` in a real process."""
    return subprocess.run(
        [sys.executable, "-m", "projections.cli", "health", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def wait_refused(config: Path, port: int, words: str) -> None:
    """Until ``ready`` on ``port`` says the database refuses writes as ``words`` begin;
    then ``projections health`` must be degraded or worse, saying so."""
    said = f"the database refuses writes: {words}"
    wait_until(
        lambda: any(r.startswith(said) for r in probe(port, "health/ready")[1]["reasons"]),
        timeout=30,
        what=f"ready to say {said!r}",
    )
    health = health_cli(config, "--json")
    assert health.returncode in (1, 2), health.stderr
    assert json.loads(health.stdout)["database"].startswith(f"refuses writes: {words}")


def assert_quiet(log: Path, words: str) -> None:
    """An instance's log through a refusal of writes: no traceback, one warning per loop
    that met it (the work, the heartbeat), each naming ``words``."""
    lines = log.read_text(encoding="utf-8").splitlines()
    assert "Traceback (most recent call last):" not in lines
    warnings = [line for line in lines if " WARNING " in line or " ERROR " in line]
    assert 1 <= len(warnings) <= 3, warnings
    assert all(words in line for line in warnings), warnings
