"""The README's first-app path works verbatim: its code blocks are extracted and run as a
new user would, from the app's folder, with the `projections` console script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clusters import stop_instance, wait_until
from sqlalchemy import text

from messaging import Database

pytestmark = pytest.mark.multiprocess

README = Path(__file__).resolve().parents[2] / "README.md"
LAUNCHER = "import sys\nfrom projections.cli import main\nsys.exit(main())\n"
"""What the installed `projections` console script runs (its folder, not the current one,
first on the path)."""


def _blocks(language: str, after: str = "") -> list[str]:
    """The README's code blocks in ``language``, those after the text ``after`` if given."""
    readme = README.read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", readme[readme.index(after) :], re.S)


def _after(marker: str, language: str) -> str:
    """The first ``language`` block after the README's text ``marker``."""
    return _blocks(language, marker)[0]


def test_every_python_block_is_valid_python() -> None:
    """The fragments (route consumers, sagas) at least compile; the first app runs below."""
    blocks = _blocks("python")
    assert len(blocks) >= 4
    for number, block in enumerate(blocks):
        compile(block, f"README.md python block {number}", "exec")


def test_the_first_app_runs_verbatim(
    tmp_path: Path, database_url: str, table_prefix: str, backend: str
) -> None:
    """bank.py, app.yaml and deposit.py from the README, in a folder: `projections run bank`
    from it finds the module, the deposit script appends through `connect` to the same
    database, tenant and prefix on a fresh database, and the read model gets the deposit."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "bank.py").write_text(_after("Save this as `bank.py`", "python"), encoding="utf-8")
    config = _after("Beside it, `app.yaml`", "yaml")
    assert config.startswith("database: sqlite:///bank.db\n")
    if backend == "mysql":  # the same file, pointed at the test server
        config = config.replace("sqlite:///bank.db", database_url)
        config += f"table-prefix: {table_prefix}\n"
    (app / "app.yaml").write_text(config, encoding="utf-8")
    (app / "deposit.py").write_text(_after("save this as `deposit.py`", "python"))
    launcher = tmp_path / "bin" / "projections"
    launcher.parent.mkdir()
    launcher.write_text(LAUNCHER, encoding="utf-8")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

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
