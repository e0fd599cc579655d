"""What a benchmark's run cost the machine, so that a figure taken on a shared, noisy host
says how busy the host was: the load average before and after, the CPU seconds of the
processes measured and of the database server on this host (from ``/proc``)."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
from sqlalchemy.engine import make_url

_PORT = re.compile(r"--port[= ](\d+)")
Mark = tuple[dict[int, float], float]
"""A server's CPU seconds at a moment: by thread, and whole."""


def load_average() -> float:
    """The 1-minute load average (``/proc/loadavg``)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_seconds(pids: Sequence[int], where: str = "/proc") -> float:
    """User + system CPU seconds of ``pids`` and their threads so far (``/proc``; of
    threads: ``/proc/<pid>/task``); a process that has ended counts nothing."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"{where}/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def server_pids(url: str) -> list[int]:
    """The pid of the MariaDB/MySQL server of ``url`` when it runs on this host (the
    ``mariadbd`` or ``mysqld`` process listening on the URL's port), none for SQLite (it
    runs inside the processes that use it) or a server elsewhere."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" or parsed.host not in (None, "localhost", "127.0.0.1"):
        return []
    port = parsed.port or 3306
    found = []
    for name in ("mariadbd", "mysqld"):
        listed = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True)
        for pid in map(int, listed.stdout.split()):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            match = _PORT.search(command)
            if (int(match.group(1)) if match else 3306) == port:
                found.append(pid)
    return found


class Server:
    """The database server of ``url`` on this host: its CPU seconds, and those of its
    threads that serve the URL's database (MariaDB's ``PROCESSLIST.TID``), so that other
    users of a shared server are not counted. Nothing for SQLite or a remote server."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pids = server_pids(url)

    def threads(self) -> dict[int, float]:
        """CPU seconds of each thread of the server so far (none of a process that has
        ended: a test's own server, taken for this one by its port, may stop meanwhile)."""
        found = {}
        for pid in self.pids:
            try:
                tasks = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
            except OSError:
                continue
            found.update({t: cpu_seconds([t], f"/proc/{pid}/task") for t in tasks})
        return found

    def mark(self) -> Mark:
        """Where the server's CPU seconds stand now, by thread and whole."""
        return self.threads(), cpu_seconds(self.pids)

    def since(self, mark: Mark) -> tuple[float, float]:
        """CPU seconds since ``mark``: of the threads serving this database, of the whole."""
        threads, whole = mark
        now = self.threads()
        ours = sum(now[t] - threads.get(t, 0.0) for t in self.serving() if t in now)
        return ours, cpu_seconds(self.pids) - whole

    def serving(self) -> list[int]:
        """The threads serving a connection to the URL's database now."""
        if not self.pids:
            return []
        import bench_mysql  # PyMySQL: only where a server was found

        con = bench_mysql.connect(self.url)
        try:
            with con.cursor() as cur:
                cur.execute("SELECT TID FROM information_schema.PROCESSLIST WHERE DB = DATABASE()")
                return [int(tid) for (tid,) in cur.fetchall() if tid]
        finally:
            con.close()


@attrs.define
class Costs:
    """The CPU seconds and wall time one measured stretch took, and the host's load."""

    own: float = 0.0
    """CPU seconds of the processes measured (or of this process's loop)."""
    server: float = 0.0
    """CPU seconds of the database server's threads serving this database (0 for SQLite)."""
    server_whole: float = 0.0
    """CPU seconds of the whole server, other users of it included."""
    wall: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    count: int = 0
    """Items (messages, deadlines) handled in the stretch, where the caller counts them."""

    def add(self, other: Costs) -> None:
        """Add ``other``, a later stretch, to these."""
        if not self.wall:
            self.load_before = other.load_before
        self.own += other.own
        self.server += other.server
        self.server_whole += other.server_whole
        self.wall += other.wall
        self.count += other.count
        self.load_after = other.load_after

    def per_item(self) -> tuple[float, float]:
        """CPU seconds per item counted: the processes', the server's."""
        return self.own / self.count, self.server / self.count

    def describe(self) -> str:
        return (
            f"load average {self.load_before:.2f} -> {self.load_after:.2f} on "
            f"{os.cpu_count()} cores; cores busy: measured {self.own / self.wall:.2f}, "
            f"database server {self.server / self.wall:.2f} (whole server, shared: "
            f"{self.server_whole / self.wall:.2f})"
        )


@contextmanager
def measured(server: Server, own: Callable[[], float] = time.process_time) -> Iterator[Costs]:
    """Measure the stretch run inside: ``own()`` (this process's CPU time unless told;
    e.g. ``lambda: cpu_seconds(pids)``) and the ``server``'s CPU seconds, its whole and
    those of its threads serving this database."""
    costs = Costs(load_before=load_average())
    mark = server.mark()
    started, own_before = time.perf_counter(), own()
    try:
        yield costs
    finally:
        costs.wall = time.perf_counter() - started
        costs.own = own() - own_before
        costs.server, costs.server_whole = server.since(mark)
        costs.load_after = load_average()


def spread(values: Sequence[float]) -> str:
    """The median, and how far the runs range around it (``min-max, ±x %``)."""
    median = statistics.median(values)
    half = (max(values) - min(values)) / 2 / median * 100 if median else 0.0
    return f"{median:,.3g} (runs {min(values):,.3g}-{max(values):,.3g}, ±{half:.0f} %)"


def cpu_ratio(label: str, ours: Sequence[Costs], theirs: Sequence[Costs], unit: str) -> str:
    """A line of the CPU µs per ``unit`` (each run's process time plus its server threads')
    of the framework's runs and of a baseline's (``label``) run beside them, the ratio
    baseline/framework of each pair (comparable to a throughput ratio), and the load."""

    def per(costs: Costs) -> float:
        return (costs.own + costs.server) / costs.count * 1e6

    mine, base = [per(c) for c in ours], [per(c) for c in theirs]
    pairs = [b / a for a, b in zip(mine, base, strict=True)]
    loads = [c.load_before for c in (*ours, *theirs)] + [c.load_after for c in (*ours, *theirs)]
    return (
        f"  CPU µs per {unit} (process + server threads): framework {spread(mine)}; {label} "
        f"{spread(base)}\n  CPU ratio {label}/framework per pair: {spread(pairs)}; load "
        f"average {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores"
    )
