"""Appenders never hang on a network that dies without a word: the :class:`SilentProxy`
lets an append's COMMIT reach MariaDB, then freezes (the transaction commits, its answer
never comes), and either stays frozen or forgets every connection (new ones pass).

- ``projections append`` (a real process, stale-instance-timeout 1 s: an answer bound of
  2 s) finishes, or fails with one line naming the database and the time waited, within
  two answer bounds (:data:`~messaging.store._retry.COMMAND_PATIENCE`) of the freeze; its
  retries store every line once.
- The documented Python append (``MessageStore.append`` in ``db.transaction()``) fails
  with the driver's 2013 within one answer bound; retried with the same
  ``expected_version`` as the README says, it stores its messages once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import fault_app
import pytest
from clusters import wait_until, write_config
from fault_model import message_ids
from silent_proxy import SilentProxy
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from messaging import Database, MessageStore, VersionConflict, is_ambiguous
from messaging.store._retry import COMMAND_PATIENCE

pytestmark = [pytest.mark.faults, pytest.mark.mysql, pytest.mark.multiprocess]

ANSWER = 2.0
"""The answer bound at write_config's stale-instance-timeout (1 s): twice max(1, 1 / 4)."""
BUDGET = COMMAND_PATIENCE * ANSWER
"""A one-shot command's transaction gives up once this long has passed since it began."""
SLACK = 1.0
"""Backoff (at most write_config's max-delay, 0.1 s) and the process's own exit."""
LINES, BATCH = 100, 20
APPEND = [sys.executable, "-m", "projections.cli", "append", "--batch-size", str(BATCH)]


def _lines(path: Path) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for seq in range(1, LINES + 1):
            payload = {"source": f"src-{seq % 5}", "seq": seq}
            line = {"topic": fault_app.TOPIC, "source": payload["source"]}
            out.write(json.dumps({**line, "type": "test.fault.numbered", "payload": payload}))
            out.write("\n")
    return path


def _insert_into(db: Database) -> bytes:
    """What an append's INSERT of messages sends, for :meth:`SilentProxy.freeze_at_commit`."""
    return f"INSERT INTO {db.schema.messages.name}".encode()


@pytest.mark.parametrize("ending", ["freeze", "forget"])
def test_cli_append_finishes_or_fails_in_one_line_within_its_budget_storing_each_line_once(
    db: Database, silent: SilentProxy, tmp_path: Path, ending: str
) -> None:
    proxied = Database(silent.url(db.url), table_prefix=db.schema.prefix)
    config = write_config(tmp_path / "config.yaml", proxied)
    proxied.dispose()
    silent.freeze_at_commit(_insert_into(db), skip=2)  # the third batch's commit
    process = subprocess.Popen(
        [*APPEND, str(_lines(tmp_path / "in.jsonl")), "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: silent.frozen_at, timeout=30, what="the third batch's commit")
    if ending == "forget":
        time.sleep(ANSWER / 2)
        silent.forget()
    out, err = process.communicate(timeout=60)
    assert silent.frozen_at is not None
    waited = time.monotonic() - silent.frozen_at
    stored = message_ids(db, fault_app.TOPIC)
    print(f"\n{ending}: ended {waited:.2f}s after the freeze (budget {BUDGET:.0f}s): {err or out}")
    assert waited <= BUDGET + SLACK
    assert set(stored.values()) == {1}, stored  # no line stored twice
    *logged, last = err.splitlines() or [""]  # the retries' WARNING lines, then the error
    assert "Traceback" not in err, err
    if ending == "forget":  # the retry found the frozen commit stored, and went on
        assert (process.returncode, out.splitlines()[0]) == (0, f"appended {LINES} messages")
        assert all(" WARNING " in line for line in err.splitlines()), err
        assert len(stored) == LINES
        return
    assert process.returncode == 1 and out == ""
    assert all(" WARNING " in line for line in logged), err
    said = re.fullmatch(
        r"projections: error: lines 41-60: append gave up after ([\d.]+)s and \d+ attempt\(s\) "
        r"waiting for database (\S+): \(2013, 'Lost connection to MySQL server during query "
        r"\(timed out\)'\) \(it may have committed\); 40 earlier lines were appended",
        last,
    )
    assert said is not None, err
    assert BUDGET <= float(said[1]) <= BUDGET + SLACK
    assert said[2] == f"mysql+pymysql://root@127.0.0.1:{silent.port}/{db.url.rsplit('/', 1)[1]}"
    assert len(stored) == 60  # the frozen batch did commit, once


def _append(db: Database, store: MessageStore, ids: list[str]) -> None:
    """The README's append: one source's messages, new (expected version 0), each with an id."""
    with db.transaction() as conn:
        for version, message_id in enumerate(ids):
            store.append(
                conn,
                fault_app.TOPIC,
                "src-py",
                [fault_app.Numbered("src-py", version + 1)],
                expected_version=version,
                headers={"message-id": message_id},
            )


def _unanswered(db: Database, store: MessageStore, ids: list[str]) -> float:
    """Append, expecting the driver's 2013 within the answer bound; how long it took."""
    started = time.monotonic()
    with pytest.raises(OperationalError) as lost:
        _append(db, store, ids)
    assert is_ambiguous(lost.value) and "(2013, " in str(lost.value.orig), lost.value
    return time.monotonic() - started


@pytest.mark.parametrize("ending", ["freeze", "forget"])
def test_python_append_fails_with_2013_within_the_answer_bound_and_its_retry_stores_once(
    db: Database, silent: SilentProxy, ending: str
) -> None:
    proxied = Database(silent.url(db.url), table_prefix=db.schema.prefix, answer_timeout=ANSWER)
    store = MessageStore(proxied)
    ids = [uuid.uuid4().hex for _ in range(3)]
    try:
        silent.freeze_at_commit(_insert_into(db))
        first = _unanswered(proxied, store, ids)
        if ending == "forget":
            silent.forget()
            again = 0.0
        else:  # still frozen: the retry's new connection gets no greeting either
            again = _unanswered(proxied, store, ids)
            silent.thaw()
        with pytest.raises(VersionConflict):  # the same expected versions: it committed
            _append(proxied, store, ids)
    finally:
        proxied.dispose()
    print(f"\n{ending}: 2013 after {first:.2f}s, the retry's after {again:.2f}s")
    assert first <= ANSWER + 0.5 and again <= ANSWER + 0.5
    m = db.schema.messages
    with db.read() as conn:
        headers = conn.execute(
            select(m.c.headers).where(m.c.tenant == db.tenant, m.c.source == "src-py")
        ).scalars()
        stored = Counter(json.loads(h)["message-id"] for h in headers)
    assert stored == Counter(ids)  # the retry's conflict proves its messages are there, once
