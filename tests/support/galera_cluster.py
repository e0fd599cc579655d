"""A 3-node MariaDB Galera cluster on loopback, for the tests and for a developer.

Each node is a ``mariadbd`` with its own datadir under one directory, its own SQL port and
group-communication port, all on 127.0.0.1; the shared server on 3306 is never touched.
No node ever copies a whole datadir over the network: the first node is installed,
bootstrapped (``--wsrep-new-cluster``) and stopped cleanly, its datadir is copied for the
others, so every node starts at the same cluster state and joins with nothing (or an
incremental transfer, IST) to receive. A killed node is restarted after
``--wsrep-recover``, which reads its last committed position from InnoDB, and catches up
by IST from the gcache of a live node. Every wait is on a condition (the node answers,
``wsrep_ready=ON``, ``wsrep_cluster_size``), never a fixed sleep.

As a command (``python3 tests/support/galera_cluster.py start|stop|status|kill N|restart N``, or
``scripts/galera-dev-cluster.sh``), the cluster lives in ``--directory`` (default
``/tmp/projections-galera``) and outlives the command; ``database test`` exists on it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pymysql

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
DEFAULT_DIRECTORY = Path("/tmp/projections-galera")
SQL_PORT = 4406
GCOMM_PORT = 4567
FAILURE_DETECTION = (
    # A killed node is evicted after evs.suspect_timeout; meanwhile nobody commits.
    "evs.keepalive_period=PT0.5S;evs.suspect_timeout=PT2S;"
    "evs.inactive_timeout=PT3S;evs.install_timeout=PT3S"
)
"""Galera's defaults are 5 s suspect / 15 s inactive timeouts; a loopback cluster can
notice a dead node faster (on a real network, keep margins above the worst pause)."""


def free_port_base(start: int, offsets: list[int]) -> int:
    """The first port base from ``start`` (stepping 100) where every base+offset is free."""
    for base in range(start, start + 10_000, 100):
        try:
            for offset in offsets:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no free ports from {start}")


SQL_OFFSETS = [0, 1, 2]
GCOMM_OFFSETS = [i + 10 * n for n in range(3) for i in range(3)]
"""The ports a 3-node cluster uses above its SQL and group-communication bases."""


class GaleraError(RuntimeError):
    """A node did not start, join or stop as expected; the message names its log."""


class GaleraCluster:
    """Three (``size``) nodes in ``directory``: node ``i`` serves SQL on ``sql_port + i``
    and group communication on ``gcomm_port + 10 * i`` (+1 incremental transfers, +2
    full transfers, which rsync does if ever needed)."""

    def __init__(
        self,
        directory: Path = DEFAULT_DIRECTORY,
        *,
        size: int = 3,
        sql_port: int = SQL_PORT,
        gcomm_port: int = GCOMM_PORT,
    ) -> None:
        self.directory = directory
        self.size = size
        self.sql_ports = [sql_port + i for i in range(size)]
        self.gcomm_ports = [gcomm_port + 10 * i for i in range(size)]
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    # -- addresses -------------------------------------------------------------------

    def url(self, node: int, database: str = "test") -> str:
        """The SQLAlchemy URL of ``database`` on one node."""
        return f"mysql+pymysql://root@127.0.0.1:{self.sql_ports[node]}/{database}"

    def multi_url(self, database: str = "test", nodes: list[int] | None = None) -> str:
        """One URL naming several nodes (``host:port,host:port``), tried in that order."""
        hosts = ",".join(f"127.0.0.1:{self.sql_ports[i]}" for i in nodes or range(self.size))
        return f"mysql+pymysql://root@{hosts}/{database}"

    def _datadir(self, node: int) -> Path:
        return self.directory / f"node{node}"

    def _log(self, node: int) -> Path:
        return self.directory / f"node{node}.log"

    def _tmpdir(self) -> Path:
        """The nodes' temporary folder: a starting mariadbd deletes every ``#sql*`` file in
        its tmpdir, which in /tmp are another server's live temporary tables."""
        tmpdir = self.directory / "tmp"
        tmpdir.mkdir(parents=True, exist_ok=True)
        tmpdir.chmod(0o777)
        return tmpdir

    def _pid_file(self, node: int) -> Path:
        return self.directory / f"node{node}.pid"

    def _args(self, node: int) -> list[str]:
        gcomm = self.gcomm_ports[node]
        peers = ",".join(f"127.0.0.1:{port}" for port in self.gcomm_ports)
        options = (
            f"gmcast.listen_addr=tcp://127.0.0.1:{gcomm};ist.recv_addr=127.0.0.1:{gcomm + 1};"
            f"gcache.size=128M;{FAILURE_DETECTION}"
        )
        return [
            MARIADBD,
            "--no-defaults",
            f"--datadir={self._datadir(node)}",
            f"--tmpdir={self._tmpdir()}",
            f"--port={self.sql_ports[node]}",
            "--bind-address=127.0.0.1",
            f"--socket={self.directory / f'node{node}.sock'}",
            f"--pid-file={self._pid_file(node)}",
            f"--log-error={self._log(node)}",
            "--user=root",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M",
            "--innodb-flush-log-at-trx-commit=2",  # durability comes from the other nodes
            "--max-connections=500",
            "--wsrep-on=ON",
            f"--wsrep-provider={PROVIDER}",
            f"--wsrep-cluster-address=gcomm://{peers}",
            "--wsrep-cluster-name=projections-dev",
            f"--wsrep-node-name=node{node}",
            f"--wsrep-node-address=127.0.0.1:{gcomm}",
            f"--wsrep-provider-options={options}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{gcomm + 2}",
            "--wsrep-slave-threads=2",
            "--binlog-format=ROW",
            "--innodb-autoinc-lock-mode=2",
            "--default-storage-engine=InnoDB",
        ]

    # -- one node --------------------------------------------------------------------

    def _pid(self, node: int) -> int | None:
        process = self._processes.get(node)
        if process is not None:
            return process.pid if process.poll() is None else None
        try:
            pid = int(self._pid_file(node).read_text().strip())
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        return None if state == "Z" else pid

    def running(self, node: int) -> bool:
        """Whether the node's server process is alive."""
        return self._pid(node) is not None

    def status(self, node: int) -> dict[str, str] | None:
        """The node's ``wsrep_%`` status variables, or None when it does not answer."""
        try:
            conn = pymysql.connect(  # a paused node answers nothing: do not wait for ever
                host="127.0.0.1",
                port=self.sql_ports[node],
                user="root",
                connect_timeout=1,
                read_timeout=5,
            )
        except pymysql.err.OperationalError:
            return None
        try:
            with conn.cursor() as cursor:
                cursor.execute("SHOW STATUS LIKE 'wsrep%%'")
                return {str(k): str(v) for k, v in cursor.fetchall()}
        except pymysql.err.MySQLError:
            return None
        finally:
            conn.close()

    def wait_synced(self, node: int, *, cluster_size: int, timeout: float = 90) -> None:
        """Wait until the node is ready (``wsrep_ready=ON``, synced) in a primary component
        of ``cluster_size`` nodes; :class:`GaleraError` if it dies or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(node)
            if (
                status is not None
                and status.get("wsrep_ready") == "ON"
                and status.get("wsrep_local_state_comment") == "Synced"
                and status.get("wsrep_cluster_status") == "Primary"
                and int(status.get("wsrep_cluster_size", "0")) == cluster_size
            ):
                return
            if not self.running(node):
                raise GaleraError(f"galera node{node} exited; see {self._log(node)}")
            if time.monotonic() > deadline:
                raise GaleraError(
                    f"galera node{node} not synced in a cluster of {cluster_size} after "
                    f"{timeout}s (status {status}); see {self._log(node)}"
                )
            time.sleep(0.1)

    def wait_rejoined(self, node: int, *, timeout: float = 90) -> None:
        """Wait until a node that was cut off (paused, isolated) is back: in the same
        membership as every other node (``wsrep_cluster_conf_id``: a node that has just
        resumed still reports the one it had before), all of them, and synced."""
        deadline = time.monotonic() + timeout
        while True:
            views = {(self.status(i) or {}).get("wsrep_cluster_conf_id") for i in range(self.size)}
            if len(views) == 1 and None not in views:
                break
            if time.monotonic() > deadline:
                raise GaleraError(f"galera node{node} not back after {timeout}s: views {views}")
            time.sleep(0.1)
        self.wait_synced(node, cluster_size=self.size, timeout=timeout)

    def _launch(self, node: int, *extra: str) -> None:
        self._pid_file(node).unlink(missing_ok=True)
        self._processes[node] = subprocess.Popen(
            [*self._args(node), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a developer's cluster outlives the command
        )

    def _live_count(self) -> int:
        return sum(self.running(i) for i in range(self.size))

    def start_node(self, node: int, *, bootstrap: bool = False) -> None:
        """Start one node (a new cluster if ``bootstrap``) and wait until it is synced."""
        if self.running(node):
            raise GaleraError(f"galera node{node} is already running")
        cluster_size = 1 if bootstrap else self._live_count() + 1
        self._launch(node, *(["--wsrep-new-cluster"] if bootstrap else []))
        self.wait_synced(node, cluster_size=cluster_size)

    def stop_node(self, node: int, *, timeout: float = 60) -> None:
        """A clean shutdown (SIGTERM), waited for."""
        self._signal(node, signal.SIGTERM, timeout)

    def pause_node(self, node: int, paused: bool = True) -> None:
        """SIGSTOP the node's server, as a frozen VM: its clients and peers get no answer
        and no reset, nothing is closed; or SIGCONT it."""
        pid = self._pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def kill_node(self, node: int) -> None:
        """SIGKILL the node, as a crash would; returns once the process is gone."""
        self._signal(node, signal.SIGKILL, 10)

    def _signal(self, node: int, signum: int, timeout: float) -> None:
        pid = self._pid(node)
        if pid is None:
            return
        os.kill(pid, signum)
        deadline = time.monotonic() + timeout
        while self.running(node):
            if time.monotonic() > deadline:
                raise GaleraError(f"galera node{node} did not exit; see {self._log(node)}")
            time.sleep(0.05)
        process = self._processes.pop(node, None)
        if process is not None:
            process.wait()

    def recover_position(self, node: int) -> str:
        """``--wsrep-recover``: the node's last committed ``uuid:seqno``, from InnoDB."""
        log = self.directory / f"node{node}.recover.log"
        log.unlink(missing_ok=True)
        args = [a for a in self._args(node) if not a.startswith("--log-error")]
        subprocess.run(
            [*args, f"--log-error={log}", "--wsrep-recover"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        found = re.findall(r"Recovered position: (\S+:-?\d+)", log.read_text(errors="replace"))
        if not found:
            raise GaleraError(f"galera node{node}: no recovered position in {log}")
        return str(found[-1])

    def isolate(self, node: int, isolated: bool = True) -> None:
        """Cut the node off from the others' group communication (``gmcast.isolate``), or
        let it rejoin: isolated, it leaves the primary component once the others evict it
        and answers 1047 to every statement, while its server keeps running."""
        conn = pymysql.connect(host="127.0.0.1", port=self.sql_ports[node], user="root")
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    f"SET GLOBAL wsrep_provider_options = 'gmcast.isolate={int(isolated)}'"
                )
        finally:
            conn.close()

    def restart_node(self, node: int) -> None:
        """Start a stopped or killed node again: recover its position, rejoin (by IST)."""
        position = self.recover_position(node)
        cluster_size = self._live_count() + 1
        self._launch(node, f"--wsrep-start-position={position}")
        self.wait_synced(node, cluster_size=cluster_size)

    # -- the cluster -----------------------------------------------------------------

    def create(self) -> None:
        """A fresh cluster: install node 0, bootstrap it, create ``test``, stop it, and copy
        its datadir for the others (their state equals node 0's: no transfer on join)."""
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        subprocess.run(
            [
                INSTALL_DB,
                "--no-defaults",
                f"--datadir={self._datadir(0)}",
                f"--tmpdir={self._tmpdir()}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.start_node(0, bootstrap=True)
        conn = pymysql.connect(host="127.0.0.1", port=self.sql_ports[0], user="root")
        try:
            with conn.cursor() as cursor:
                cursor.execute("CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4")
        finally:
            conn.close()
        self.stop_node(0)
        for node in range(1, self.size):
            shutil.copytree(self._datadir(0), self._datadir(node))
            (self._datadir(node) / "gvwstate.dat").unlink(missing_ok=True)
        for node in range(self.size):
            # The rsync daemon of a transfer (run even for IST, in "bypass" mode) drops
            # root for nobody, who must be able to write the marker it leaves there.
            self._datadir(node).chmod(0o777)

    def start(self) -> None:
        """Create the cluster if there is none, then start every node: the one safe to
        bootstrap from first (``--wsrep-new-cluster``), the others joining it."""
        if not (self.directory / "node0").exists():
            self.create()
        first = next(
            (
                i
                for i in range(self.size)
                if "safe_to_bootstrap: 1" in self._grastate(i) and not self.running(i)
            ),
            0,
        )
        if not any(self.running(i) for i in range(self.size)):
            self.start_node(first, bootstrap=True)
        for node in range(self.size):
            if not self.running(node):
                self.start_node(node)

    def _grastate(self, node: int) -> str:
        path = self._datadir(node) / "grastate.dat"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        """Stop every node cleanly, the last one (safe to bootstrap from) last."""
        for node in reversed(range(self.size)):
            self.stop_node(node)

    def destroy(self) -> None:
        """Stop every node and delete the directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """The developer's command: start, stop, status, kill N, restart N, destroy."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command", choices=["start", "stop", "status", "kill", "restart", "destroy"]
    )
    parser.add_argument("node", nargs="?", type=int, help="node number (kill, restart)")
    parser.add_argument("--directory", type=Path, default=DEFAULT_DIRECTORY)
    parser.add_argument("--sql-port", type=int, default=SQL_PORT)
    parser.add_argument("--gcomm-port", type=int, default=GCOMM_PORT)
    args = parser.parse_args(argv)
    cluster = GaleraCluster(args.directory, sql_port=args.sql_port, gcomm_port=args.gcomm_port)
    if args.command in ("kill", "restart") and args.node is None:
        parser.error(f"{args.command} needs a node number (0-{cluster.size - 1})")
    try:
        if args.command == "start":
            cluster.start()
            print(f"galera cluster up: database: {cluster.multi_url()}")
        elif args.command == "stop":
            cluster.stop()
        elif args.command == "destroy":
            cluster.destroy()
        elif args.command == "kill":
            cluster.kill_node(args.node)
        elif args.command == "restart":
            cluster.restart_node(args.node)
        for node in range(cluster.size):
            status = cluster.status(node) or {}
            print(
                f"node{node} 127.0.0.1:{cluster.sql_ports[node]} "
                f"{'running' if cluster.running(node) else 'stopped'} "
                f"{status.get('wsrep_local_state_comment', '-')} "
                f"cluster_size={status.get('wsrep_cluster_size', '-')}"
            )
    except GaleraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
