"""The ledger's instance processes of a long test, disrupted in turn: a SIGKILL and a
replacement, a joiner (a handover), a clean stop; and a rebuild through the CLI."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from clusters import cli, registered, start_instance, stop_instance, wait_until
from forked import Process
from ledger_waits import CONSUMER

from messaging import Database


class Fleet:
    """Instances named ``prefix1``, ``prefix2``… started from ``configs`` in turn (on
    Galera, one per node order), each logging to ``logs/NAME.log``."""

    def __init__(
        self, db: Database, configs: Sequence[Path], logs: Path, prefix: str = "k"
    ) -> None:
        self.db = db
        self.configs = list(configs)
        self.logs = logs
        self.prefix = prefix
        self.running: dict[str, Process] = {}
        """Name → process, oldest first."""
        self.exits: dict[str, int] = {}
        """Name → exit code of each instance stopped cleanly."""
        self.events: list[str] = []
        """What happened to the instances, with the wall-clock time (for their logs)."""
        self._started = 0

    def _note(self, event: str) -> None:
        line = f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} {event}"
        self.events.append(line)
        with (self.logs / "instances.txt").open("a", encoding="utf-8") as file:
            file.write(line + "\n")

    def summary(self, shown: int = 15) -> str:
        """The events, or past ``shown`` of them how many of each kind and where all are."""
        if len(self.events) <= shown:
            return "; ".join(self.events)
        kinds = Counter(event.split()[1] for event in self.events)
        return (
            ", ".join(f"{kind} {n}" for kind, n in kinds.items())
            + f"; every event in {self.logs / 'instances.txt'}"
        )

    def start(self) -> str:
        """Start the next instance; its name."""
        self._started += 1
        name = f"{self.prefix}{self._started}"
        config = self.configs[(self._started - 1) % len(self.configs)]
        self.running[name] = start_instance(config, name, log=self.logs / f"{name}.log")
        self._note(f"started {name}")
        return name

    def disrupt(self, turn: int) -> None:
        """Disruption ``turn``, in turn: SIGKILL the oldest instance and start a
        replacement; start a joiner (partitions hand over to it); stop the oldest cleanly
        (unless it is the only one)."""
        kind = turn % 3
        if kind == 1 or (kind == 2 and len(self.running) < 2):
            self.start()
            return
        name = next(iter(self.running))
        process = self.running.pop(name)
        if kind == 0:
            process.kill()
            process.wait(10)
            self._note(f"SIGKILLed {name}")
            self.start()
        else:
            self._stop(name, process)

    def rebuild(self) -> None:
        """Request a rebuild of the ledger's projection (``projections rebuild``)."""
        answer = cli(self.configs[0], "rebuild", CONSUMER, "--reason", "read your writes")
        assert f"rebuild of {CONSUMER} requested" in answer, answer
        self._note("rebuild requested")

    def stop_all(self) -> None:
        """Stop every running instance cleanly (exit codes in :attr:`exits`)."""
        while self.running:
            name = next(iter(self.running))
            self._stop(name, self.running.pop(name))

    def _stop(self, name: str, process: Process) -> None:
        """SIGTERM an instance once it has registered (before, its Python may still be
        importing, with no handler for the signal yet)."""
        if process.poll() is None:
            wait_until(lambda: registered(self.db, name), timeout=60, what=f"{name} to register")
        self.exits[name] = stop_instance(process)
        self._note(f"stopped {name}: exit {self.exits[name]}")
