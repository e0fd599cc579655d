"""The README's first-app path works verbatim: its code blocks are extracted and run as a
new user would, from the app's folder, with the `projections` console script; so does the
web example of docs/how-to/read-your-writes.md beside it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import attrs
import pytest
import yaml
from clusters import stop_instance, wait_until
from sqlalchemy import select, text

import sagas  # noqa: F401  (registers the saga kind: its section is a key of the file)
from messaging import Database, Settings
from messaging._settings import consumer_sections

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
WAIT_GUIDE = ROOT / "docs" / "how-to" / "read-your-writes.md"
CONFIGURATION_FILE = ROOT / "docs" / "reference" / "configuration-file.md"
LAUNCHER = "import sys\nfrom projections.cli import main\nsys.exit(main())\n"
"""What the installed `projections` console script runs (its folder, not the current one,
first on the path)."""


def _blocks(language: str, after: str = "", page: Path = README) -> list[str]:
    """The code blocks in ``language`` of ``page`` (the README), those after the text
    ``after`` if given."""
    text = page.read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text[text.index(after) :], re.S)


def _after(marker: str, language: str, page: Path = README) -> str:
    """The first ``language`` block after the text ``marker`` of ``page``."""
    return _blocks(language, marker, page)[0]


def test_every_python_block_is_valid_python() -> None:
    """The README's blocks compile (tests/docs runs every block of the README and docs/)."""
    blocks = _blocks("python")
    assert len(blocks) >= 3
    for number, block in enumerate(blocks):
        compile(block, f"README.md python block {number}", "exec")


def _dotted_keys(value: object, prefix: str = "") -> set[str]:
    """Every key of a parsed YAML mapping, nested ones as ``section.key``."""
    if not isinstance(value, dict):
        return set()
    keys = set()
    for key, inner in value.items():
        keys |= {prefix + key, *_dotted_keys(inner, f"{prefix}{key}.")}
    return keys


def _settings_keys(cls: type, prefix: str = "") -> set[str]:
    """The keys a settings file may give for the attrs settings class ``cls``."""
    keys = set()
    for field in attrs.fields(attrs.resolve_types(cls)):
        key = prefix + field.name.replace("_", "-")
        keys.add(key)
        if isinstance(field.type, type) and attrs.has(field.type):
            keys |= _settings_keys(field.type, f"{key}.")
    return keys


def test_the_configuration_reference_names_every_key() -> None:
    """The annotated YAML block of docs/reference/configuration-file.md shows every key of
    the settings file: those of `Settings` (sections nested) and the consumer kinds'
    sections."""
    documented = _dotted_keys(yaml.safe_load(_after("", "yaml", CONFIGURATION_FILE)))
    expected = _settings_keys(Settings) - {"consumer-groups"} | set(consumer_sections())
    assert sorted(expected - documented) == []


def _bank_app(
    tmp_path: Path, database_url: str, table_prefix: str, backend: str
) -> tuple[Path, Path, dict[str, str]]:
    """The README's `bank.py` and `app.yaml` in a folder (the file pointed at the test
    server on MySQL), the `projections` launcher and the environment to run them with."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "bank.py").write_text(_after("Save this as `bank.py`", "python"), encoding="utf-8")
    config = _after("Beside it, `app.yaml`", "yaml")
    assert config.startswith("database: sqlite:///bank.db\n")
    if backend == "mysql":  # the same file, pointed at the test server
        config = config.replace("sqlite:///bank.db", database_url)
        config += f"table-prefix: {table_prefix}\n"
    (app / "app.yaml").write_text(config, encoding="utf-8")
    launcher = tmp_path / "bin" / "projections"
    launcher.parent.mkdir()
    launcher.write_text(LAUNCHER, encoding="utf-8")
    return app, launcher, {**os.environ, "PYTHONUNBUFFERED": "1"}


def test_the_first_app_runs_verbatim(
    tmp_path: Path, database_url: str, table_prefix: str, backend: str
) -> None:
    """bank.py, app.yaml and deposit.py from the README, in a folder: `projections run bank`
    from it finds the module, the deposit script appends through `connect` to the same
    database, tenant and prefix on a fresh database, and the read model gets the deposit."""
    app, launcher, env = _bank_app(tmp_path, database_url, table_prefix, backend)
    (app / "deposit.py").write_text(_after("save this as `deposit.py`", "python"))
    (app / "balance.py").write_text(_after("save this as `balance.py`", "python"))

    if backend == "mysql":
        migrate = [sys.executable, str(launcher), "db", "migrate", "--config", "app.yaml"]
        subprocess.run(migrate, cwd=app, env=env, check=True, timeout=60)
    instance = subprocess.Popen(
        [sys.executable, str(launcher), "run", "bank", "--config", "app.yaml"],
        cwd=app,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deposit = subprocess.run(
            [sys.executable, "deposit.py"], cwd=app, env=env, capture_output=True, text=True
        )
        assert deposit.returncode == 0, deposit.stderr
        url = f"sqlite:///{app / 'bank.db'}" if backend == "sqlite" else database_url
        db = Database(url, table_prefix=table_prefix if backend == "mysql" else "prj_")

        def balance() -> int | None:
            if instance.poll() is not None:
                raise AssertionError(instance.communicate()[1])
            with db.read() as conn:
                try:
                    rows = conn.execute(text("SELECT account_id, balance FROM balances")).all()
                except Exception:
                    return None  # not created yet
            return {account: balance for account, balance in rows}.get("acct-1") == 10 or None

        wait_until(balance, timeout=60, what="the deposit in the read model")
        read = subprocess.run(
            [sys.executable, "balance.py"], cwd=app, env=env, capture_output=True, text=True
        )
        assert (read.returncode, read.stdout) == (0, "acct-1 10\n"), read.stderr
        again = subprocess.run(
            [sys.executable, "deposit.py"], cwd=app, env=env, capture_output=True, text=True
        )
        assert again.returncode == 1 and "VersionConflict" in again.stderr
    finally:
        code = stop_instance(instance)
        assert code == 0, instance.communicate()[1]
        if backend == "mysql":
            with Database(database_url).engine.begin() as conn:
                conn.execute(text("DROP TABLE IF EXISTS balances"))


def test_the_read_your_writes_web_example_runs_verbatim(
    tmp_path: Path, database_url: str, table_prefix: str, backend: str
) -> None:
    """web.py from docs/how-to/read-your-writes.md beside a running `bank` instance: each
    POST answers 200 with the balance that includes its deposit, and its token waits with
    `projections wait`."""
    app, launcher, env = _bank_app(tmp_path, database_url, table_prefix, backend)
    web_py = _after("save this as `web.py`", "python", WAIT_GUIDE)
    (app / "web.py").write_text(web_py, encoding="utf-8")
    with socket.socket() as probe:  # a free port for the example's server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if backend == "mysql":
        migrate = [sys.executable, str(launcher), "db", "migrate", "--config", "app.yaml"]
        subprocess.run(migrate, cwd=app, env=env, check=True, timeout=60)
    run = [sys.executable, str(launcher), "run", "bank", "--config", "app.yaml"]
    instance = subprocess.Popen(run, cwd=app, env=env, stderr=subprocess.PIPE, text=True)
    web = subprocess.Popen(
        [sys.executable, "web.py"], cwd=app, env={**env, "PORT": str(port)}, stderr=subprocess.PIPE
    )
    try:

        def post(amount: int) -> tuple[int, dict[str, object], str]:
            url = f"http://127.0.0.1:{port}/deposit?account=acct-2&amount={amount}"
            request = urllib.request.Request(url, method="POST")
            with urllib.request.urlopen(request, timeout=30) as answer:
                token = answer.headers["Consistency-Token"]
                return answer.status, json.loads(answer.read()), token

        def serving() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                assert web.poll() is None, web.communicate()[1]
                return False
            return True

        wait_until(serving, timeout=60, what="web.py to listen")
        url = f"sqlite:///{app / 'bank.db'}" if backend == "sqlite" else database_url
        db = Database(url, table_prefix=table_prefix if backend == "mysql" else "prj_")

        def declared() -> bool:
            c = db.schema.consumers
            with db.read() as conn:
                return (
                    conn.execute(select(c.c.name).where(c.c.name == "balances")).first() is not None
                )

        wait_until(declared, timeout=60, what="the instance to declare balances")
        db.dispose()
        total = 0
        for amount in (5, 7, 11):
            total += amount
            status, body, token = post(amount)
            assert (status, body) == (200, {"account": "acct-2", "balance": total})
        waited = subprocess.run(
            [sys.executable, str(launcher), "wait", token, "balances", "--config", "app.yaml"],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (waited.returncode, waited.stdout) == (0, "applied by balances\n"), waited.stderr
    finally:
        web.terminate()
        web.wait(30)
        code = stop_instance(instance)
        assert code == 0, instance.communicate()[1]
        if backend == "mysql":
            with Database(database_url).engine.begin() as conn:
                conn.execute(text("DROP TABLE IF EXISTS balances"))
