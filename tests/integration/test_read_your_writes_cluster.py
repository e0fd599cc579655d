"""Read your own writes against real instance processes, on both backends: concurrent
appenders (some holding the position counter while others queue behind them, some
rolling back, some impatient) each wait on their own token and then read the read model
on a new connection, while the instances are SIGKILLed and replaced, joined (handovers)
and stopped, and the projection is rebuilt. No wait may answer "applied" before the waiter
can read its write; every wait ends applied, or refused/timed out with its reason, never
before its timeout nor much after it; every account ends with exactly the deposits that
committed.

Its size comes from the environment (tests/support/waiting_appenders.py): the defaults
(4 appenders x 150 waits) keep CI short; the acceptance run is 100,000 waits."""

from __future__ import annotations

from pathlib import Path

import pytest
import ryw_reads
from clusters import write_config
from instance_fleet import Fleet
from ledger_waits import CONSUMER, deposit, ledger_instance
from ryw_reads import Reading
from waiting_appenders import Places, Plan, check, run

from messaging import Database, Progress
from messaging.store._rows import partition_of

pytestmark = pytest.mark.multiprocess


def test_waits_under_concurrent_appenders_kills_handovers_stops_and_a_rebuild(
    db: Database, tmp_path: Path
) -> None:
    plan = Plan.from_env()
    fleet = Fleet(db, [write_config(tmp_path / "config.yaml", db, batch_size=20)], tmp_path)
    places = Places(db, db, (Reading("a new connection", db),))
    tally, wall = run(plan, places, fleet)
    check(plan, places, fleet, tally, wall, label="sqlite" if db.is_sqlite else "mariadb")


def test_a_false_applied_is_diagnosed_with_the_partition_and_the_reads_after(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the run reports if a wait ever answers "applied" too soon, shown on a deposit
    that nothing applies: its position, the partition's row behind it, the account's
    messages, and the read again later still short (permanent)."""
    instance = ledger_instance(db)
    instance.start(loops=False)  # declares the projection and its partitions
    instance.stop()
    appended = deposit(db, "lost")
    monkeypatch.setattr(ryw_reads, "LATER", (0.01, 0.02))
    text = ryw_reads.diagnose(
        db, Reading("a new connection", db), "lost", 0, 1, appended, Progress(()), 0.005
    )
    position = appended[0]
    assert "false applied: lost shows 0 of 1 on a new connection" in text
    assert f"positions [{position}]" in text
    assert (
        f"{CONSUMER}#{partition_of('lost', 8)} checkpoint 0 (position {position}: BEHIND)" in text
    )
    assert f"the account's messages on the waiter's node: 1, the last at [{position}]" in text
    assert "read again: 0 after 0.01s, 0 after 0.02s: permanent" in text
