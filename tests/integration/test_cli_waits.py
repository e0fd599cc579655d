"""``projections append --wait`` and ``projections wait`` as real processes, on both
backends: the token printed by an append waits until the read model shows it; a bad token,
timeout or consumer is one error line; ``--fail-fast`` says what is behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import forked
import pytest
from clusters import owned_by, start_instance, stop_instance, wait_until, write_config
from ledger_waits import CONSUMER, balance
from sqlalchemy import func, select

from messaging import Database
from projections.examples import ledger

pytestmark = pytest.mark.multiprocess


def _run(config: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return forked.run([*args, "--config", str(config)], input=stdin, timeout=120)


def _deposit_line(account: str) -> str:
    payload = {"account_id": account, "amount": 5}
    return json.dumps(
        {"topic": ledger.TOPIC, "source": account, "type": "ledger.deposited", "payload": payload}
    )


def test_append_wait_and_wait_on_a_running_instance(db: Database, tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", db)
    process = start_instance(config, "c1")
    try:
        wait_until(lambda: owned_by(db, {"c1"}), timeout=60, what="c1 to own the partitions")
        lines = "\n".join(_deposit_line(f"cli-{n}") for n in range(3)) + "\n"
        appended = _run(config, "append", "--wait", CONSUMER, "--batch-size", "2", stdin=lines)
        assert appended.returncode == 0, appended.stderr
        out = appended.stdout.splitlines()
        assert out[0] == "appended 3 messages" and out[2] == f"applied by {CONSUMER}"
        assert out[1].startswith("token rw1.")
        assert [balance(db, f"cli-{n}") for n in range(3)] == [5, 5, 5]  # read after exit

        token = _run(config, "append", stdin=_deposit_line("later") + "\n").stdout.split()[-1]
        waited = _run(config, "wait", token, CONSUMER, "--timeout", "30")  # seconds
        assert (waited.returncode, waited.stdout) == (0, f"applied by {CONSUMER}\n")
        assert balance(db, "later") == 5

        unhandled = json.dumps(
            {"topic": ledger.TOPIC, "source": "u", "type": "ledger.audited", "payload": {}}
        )
        told = _run(
            config, "append", "--allow-unknown-type", "--wait", CONSUMER, stdin=unhandled + "\n"
        )
        assert told.returncode == 0, told.stderr
        assert told.stdout.splitlines()[2:] == [
            f"{CONSUMER} handles none of these messages: nothing of theirs to apply"
        ]
    finally:
        assert stop_instance(process) == 0

    token = _run(config, "append", stdin=_deposit_line("stopped") + "\n").stdout.split()[-1]
    not_yet = _run(config, "wait", token, CONSUMER, "--fail-fast")
    assert not_yet.returncode == 3, not_yet.stderr
    assert not_yet.stdout.startswith("not applied yet:\n  ledger-balances partition ")
    assert "1 message(s) to apply, no owner (unowned)" in not_yet.stdout
    timed_out = _run(
        config, "append", "--wait", CONSUMER, "--timeout", "200ms", stdin=_deposit_line("x") + "\n"
    )
    assert timed_out.returncode == 124 and timed_out.stdout.startswith(
        "appended 1 messages\ntoken rw1."
    )
    assert timed_out.stderr.startswith("projections: error: not applied after 0.2")
    assert len(timed_out.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        (
            ["wait", "rw1.garbage.00000000", CONSUMER],
            1,
            "checksum does not match",
        ),
        (["wait", "", CONSUMER], 1, "invalid consistency token: empty"),
        (["wait", "TOKEN", "nope"], 4, "unknown consumer 'nope'"),
        (["wait", "TOKEN", CONSUMER, "--timeout", "-1s"], 2, "--timeout"),
        (["wait", "TOKEN", CONSUMER, "--timeout", "2h"], 2, "from 0 to 3600 seconds"),
        (["append", "--wait", "nope"], 4, "unknown consumer 'nope'"),
    ],
)
def test_bad_input_is_one_error_line(
    db: Database, tmp_path: Path, args: list[str], code: int, error: str
) -> None:
    config = write_config(tmp_path / "config.yaml", db)
    token = _run(config, "append", stdin=_deposit_line("bad") + "\n").stdout.split()[-1]
    result = _run(
        config, *[token if a == "TOKEN" else a for a in args], stdin=_deposit_line("b") + "\n"
    )
    assert result.returncode == code, result
    assert error in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    with db.read() as conn:  # a refused append stored nothing: the first one alone
        stored = conn.execute(select(func.count()).select_from(db.schema.messages)).scalar()
    assert stored == 1
