"""The tests' fork server (tests/support/forked.py) starts commands as processes of their
own, as ``python -m projections.cli`` would: their own pid, the environment, directory
and streams given, an application module imported afresh in each, and signals that end
them as they end any process."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import forked
import pytest

pytestmark = pytest.mark.multiprocess


def test_a_command_runs_in_a_process_of_its_own_with_what_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "probe_app.py").write_text(
        "import os, sys\n"
        "print(os.getpid(), os.getcwd(), os.environ['PROBE'], file=sys.stderr, flush=True)\n"
        "raise SystemExit(7)\n"
    )
    env = {**os.environ, "PROBE": "one", "PYTHONPATH": str(tmp_path)}
    first = forked.run(["run", "probe_app", "--database", f"sqlite:///{tmp_path}/x.db"], env=env)
    second = forked.run(
        ["run", "probe_app", "--database", f"sqlite:///{tmp_path}/x.db"],
        env={**env, "PROBE": "two"},
        cwd=tmp_path,
    )
    (pid1, cwd1, probe1), (pid2, cwd2, probe2) = (r.stderr.split()[:3] for r in (first, second))
    assert (first.returncode, second.returncode) == (7, 7)
    assert len({pid1, pid2, str(os.getpid())}) == 3
    assert (probe1, probe2) == ("one", "two")  # the module imported again in each
    assert cwd1 == os.getcwd() and cwd2 == str(tmp_path)


def test_signals_end_it_and_its_exit_reads_as_a_popens(tmp_path: Path) -> None:
    quiet = os.open(os.devnull, os.O_WRONLY)
    process = forked.spawn(
        ["run", "projections.examples.ledger", "--database", f"sqlite:///{tmp_path}/x.db"],
        stderr=quiet,
    )
    os.close(quiet)
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.2)
    process.send_signal(signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL
