"""Overrides that fit no declared consumer fail the start, whether from YAML or built in code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from messaging import (
    ConfigError,
    Database,
    Instance,
    Settings,
    collect_consumers,
    create_plugin_manager,
)
from messaging._settings import (
    ConsumerGroupSettings,
    ConsumerOverride,
    ConsumerSettings,
    Distribution,
    MessagingSettings,
)

APP = ["projections.examples.ledger", "projections.examples.transfers"]


def _start(db: Database, settings: Settings) -> None:
    manager = create_plugin_manager(APP, load_entrypoints=False)
    instance = Instance(db, collect_consumers(manager), settings, manager.hook, name="strict")
    try:
        instance.start(loops=False)
    finally:
        instance.stop()


def _group(**overrides: ConsumerOverride) -> ConsumerGroupSettings:
    return ConsumerGroupSettings(consumers=overrides)


SINGLE = ConsumerOverride(distribution=Distribution.SINGLE_OWNER)

WRONG = {  # id: (section, name, what the error says)
    "misspelled": (
        "projections",
        "ledger-balance",
        "projections.consumers.ledger-balance: no consumer named 'ledger-balance' is "
        "declared; did you mean 'ledger-balances'?",
    ),
    "projection-under-routing": (
        "routing",
        "ledger-balances",
        "routing.consumers.ledger-balances: 'ledger-balances' is a projection; "
        "configure it under projections.consumers",
    ),
    "projection-under-sagas": (
        "sagas",
        "ledger-balances",
        "sagas.consumers.ledger-balances: 'ledger-balances' is a projection; "
        "configure it under projections.consumers",
    ),
    "saga-under-projections": (
        "projections",
        "ledger-transfers",
        "projections.consumers.ledger-transfers: 'ledger-transfers' is a saga; "
        "configure it under sagas.consumers",
    ),
    "misspelled-route": (
        "routing",
        "ledger-acounts",
        "routing.consumers.ledger-acounts: no consumer named 'ledger-acounts' is declared; "
        "did you mean 'ledger-accounts'?",
    ),
    "in-memory-distribution": (
        "projections",
        "ledger-activity",
        "projections.consumers.ledger-activity: 'ledger-activity' is an in-memory "
        "projection, which every instance runs whole",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_an_override_that_fits_no_consumer_fails_the_start(db: Database, case: str) -> None:
    """The error names the full key path and the closest declared name or the right section;
    the failed start leaves no instance registered."""
    section, name, expected = WRONG[case]
    with pytest.raises(ConfigError) as info:
        _start(db, Settings(consumer_groups={section: _group(**{name: SINGLE})}))
    assert expected in str(info.value)
    with db.read() as conn:
        assert conn.execute(db.schema.instances.select()).all() == []


def test_overrides_of_declared_consumers_start(db: Database) -> None:
    """Overrides in the right sections start as before."""
    _start(
        db,
        Settings(
            consumer_groups={
                "projections": _group(
                    **{"ledger-balances": ConsumerOverride(concurrency_limit=2, distribution=None)}
                ),
                "routing": _group(**{"ledger-accounts": SINGLE}),
                "sagas": _group(**{"ledger-transfers": SINGLE}),
            }
        ),
    )


def test_rules_run_when_settings_are_built_in_code() -> None:
    """Settings(...) in code checks the same rules as a YAML file."""
    consumer = ConsumerSettings(rebalance_interval=40.0)
    with pytest.raises(ConfigError, match=r"rebalance-interval \(40s\) must be below"):
        Settings(messaging=MessagingSettings(consumer=consumer))


@pytest.mark.parametrize(
    ("section", "name", "reason"),
    [
        ("routing", "ledger-accounts", "route consumers have no concurrency limit"),
        ("sagas", "ledger-transfers", "a saga is applied in one lane per instance"),
    ],
)
def test_concurrency_limit_is_refused_where_it_does_nothing(
    tmp_path: Path, section: str, name: str, reason: str
) -> None:
    """`projections run` with a concurrency-limit for a route consumer or a saga fails at
    start with one line naming the key, and exits 1."""
    config = tmp_path / "app.yaml"
    config.write_text(f"{section}:\n  consumers:\n    {name}: {{concurrency-limit: 2}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "projections.cli", "run", *APP, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 1
    assert f"{section}.consumers.{name}.concurrency-limit (2) is not supported: {reason}" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "projections.db").exists()


@pytest.mark.parametrize("options", [("--workers", "2"), ("--admin-port", "0")])
def test_run_refuses_a_misspelled_override_before_starting_anything(
    tmp_path: Path, options: tuple[str, str]
) -> None:
    """With workers or an admin server, the override is checked once by `run` itself: it
    exits 1 with the error once (no worker started, so none restarted in a loop) and
    creates no database."""
    config = tmp_path / "app.yaml"
    config.write_text(
        "projections:\n  consumers:\n    ledger-balance: {distribution: partitioned}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "projections.cli", "run", *APP, "--config", "app.yaml", *options],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("did you mean 'ledger-balances'?") == 1, done.stderr
    assert "app.yaml: " in done.stderr, done.stderr  # names the file, as its other errors do
    assert "worker" not in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "projections.db").exists()
