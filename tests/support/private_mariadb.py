"""A MariaDB server of a test's own (its own datadir and port), which the test may stop
and start again; the shared server on 3306 is never touched."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pymysql

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateMariaDB:
    """A throw-away server in ``directory``; :meth:`start` and :meth:`stop` as often as
    wanted. Root connects over TCP without a password."""

    def __init__(self, directory: Path, *, args: Sequence[str] = ()) -> None:
        self.directory = directory
        self.args = list(args)
        """More ``mariadbd`` options."""
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [
                INSTALL_DB,
                "--no-defaults",
                f"--datadir={directory / 'data'}",
                f"--tmpdir={self._tmpdir()}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def _tmpdir(self) -> Path:
        """A temporary folder of this server's own: a starting mariadbd deletes every
        ``#sql*`` file in its tmpdir, which in /tmp are the shared server's live temporary
        tables."""
        tmpdir = self.directory / "tmp"
        tmpdir.mkdir(parents=True, exist_ok=True)
        return tmpdir

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` on this server."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"

    def _connect(self) -> pymysql.connections.Connection:
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        log = (self.directory / "mariadbd.log").open("ab")
        self._process = subprocess.Popen(
            [
                MARIADBD,
                "--no-defaults",
                f"--datadir={self.directory / 'data'}",
                f"--tmpdir={self._tmpdir()}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.directory / 'mariadbd.sock'}",
                f"--pid-file={self.directory / 'mariadbd.pid'}",
                "--user=root",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                *self.args,
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                self._connect().close()
                return
            except pymysql.err.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"private mariadbd did not start; see {self.directory}/mariadbd.log"
                    ) from None
                time.sleep(0.1)

    def execute(self, sql: str) -> None:
        """Run one statement as root."""
        connection = self._connect()
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
            connection.commit()
        finally:
            connection.close()

    def stop(self) -> None:
        """Stop the server (SIGTERM, a clean shutdown) and wait for it."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None


@contextmanager
def running_server(tmp_path: Path, database: str) -> Iterator[PrivateMariaDB]:
    """A private server in ``tmp_path/mariadb``, started, with ``database`` created; stopped
    when the block ends."""
    folder = tmp_path / "mariadb"
    folder.mkdir()
    private = PrivateMariaDB(folder)
    private.start()
    private.execute(f"CREATE DATABASE {database}")
    try:
        yield private
    finally:
        private.stop()
