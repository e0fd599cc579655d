"""A MariaDB server of a test's own (its own datadir, port and socket), to stop and start at
will without touching the shared server."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pymysql
from clusters import wait_until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateMariaDB:
    """``mariadbd --no-defaults`` on a fresh datadir under ``folder``, root without password."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.datadir = folder / "data"
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        assert install is not None, "mariadb-install-db is needed for a private server"
        subprocess.run(
            [
                install,
                "--no-defaults",
                f"--datadir={self.datadir}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

    @property
    def url(self) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/outage"

    def start(self) -> None:
        """Start the server and wait until it accepts connections (and has the database)."""
        log = (self.folder / "server.log").open("ab")
        self.process = subprocess.Popen(
            [
                "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.folder / 'mysqld.sock'}",
                f"--pid-file={self.folder / 'mysqld.pid'}",
                "--user=root",
                "--skip-grant-tables",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        wait_until(self._create_database, timeout=60, what="the private MariaDB to start")

    def _create_database(self) -> bool:
        try:
            with pymysql.connect(host="127.0.0.1", port=self.port, user="root") as conn:
                conn.cursor().execute("CREATE DATABASE IF NOT EXISTS outage")
        except pymysql.err.OperationalError:
            return False
        return True

    def stop(self) -> None:
        """Shut the server down (SIGTERM) and wait until it has exited."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)
        self.process = None
