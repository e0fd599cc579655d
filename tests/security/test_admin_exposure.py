"""Listening where other hosts can reach: refused without a token, in-process and from the
command line; with one, the server starts and still names its Host rules."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from admin_client import TOKEN, admin_process, get_json, serve

from messaging import Database, ProjectionsError
from messaging._config import settings_from_mapping
from messaging._settings import Settings
from projections._admin import make_server
from projections._admin_guard import AdminGuard


def _non_loopback_address() -> str:
    """An address of this host that is not loopback (the wildcard if it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            address = str(probe.getsockname()[0])
        except OSError:
            return "0.0.0.0"
    return address if not address.startswith("127.") else "0.0.0.0"


@pytest.mark.parametrize("host", ["0.0.0.0", _non_loopback_address()])
def test_no_token_no_listening_beyond_loopback(tmp_path: Path, host: str) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db")
    try:
        with pytest.raises(ProjectionsError, match=r"^refusing to serve the admin endpoints on"):
            make_server(db, Settings(), host, 0)
        # ... and it let go of the port: the same address binds again at once.
        server = make_server(db, settings_from_mapping({"admin": {"token": TOKEN}}), host, 0)
        server.server_close()
    finally:
        db.dispose()


@pytest.mark.multiprocess
def test_the_admin_command_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    command = [sys.executable, "-m", "projections.cli", "admin", "--host", "0.0.0.0"]
    command += ["--port", "0", "--database", url]
    env = {k: v for k, v in os.environ.items() if k != "PROJECTIONS_ADMIN_TOKEN"}
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    [line] = refused.stderr.splitlines()
    assert line.startswith("projections: error: refusing to serve the admin endpoints on 0.0.0.0")
    assert "without an admin token" in line and "PROJECTIONS_ADMIN_TOKEN" in line
    assert refused.stdout == ""

    arguments = command[3:]
    with admin_process(*arguments, env={"PROJECTIONS_ADMIN_TOKEN": TOKEN}) as (process, base):
        assert base.startswith("http://0.0.0.0:"), base
        status, body = get_json(base.replace("0.0.0.0", "127.0.0.1") + "/admin/cluster")
        assert status == 200 and body["answered_by"].endswith(f":{process.pid}")


def test_host_rules_of_a_server_on_every_interface_and_behind_a_proxy(tmp_path: Path) -> None:
    """Bound to 0.0.0.0: loopback names and any address on its port, never another DNS
    name; allowed-hosts adds a proxy's name (any port) or name:port (that port only)."""
    guard = AdminGuard(TOKEN, ["admin.example.com", "proxy.example:8443"], "0.0.0.0", 8123)
    allowed = ["127.0.0.1:8123", "localhost:8123", "10.1.2.3:8123", "[fe80::1]:8123"]
    allowed += ["admin.example.com", "ADMIN.example.com:443", "proxy.example:8443"]
    for host in allowed:
        assert guard.check_host([host]) is None, host
    refused = ["evil.example:8123", "10.1.2.3:8124", "proxy.example", "proxy.example:443"]
    refused += ["admin.example.com.evil:8123", "", "10.1.2.3:x", "[::1"]
    for host in refused:
        refusal = guard.check_host([host])
        assert refusal is not None and refusal.status == 421, host
    assert guard.check_host(["localhost:8123", "localhost:8123"]) is not None  # two headers
    lone = AdminGuard(None, [], "10.1.2.3", 8123)
    assert lone.check_host(["10.1.2.3:8123"]) is None
    assert lone.check_host(["localhost:8123"]) is not None  # not listening there
    assert lone.check_host(["10.1.2.4:8123"]) is not None
    assert not lone.commands_enabled


def test_serve_helper_is_reachable_under_the_name_localhost(tmp_path: Path) -> None:
    """A server bound to 127.0.0.1 answers a client that says localhost."""
    db = Database(f"sqlite:///{tmp_path}/y.db")
    db.prepare()
    server = make_server(db, Settings(), "127.0.0.1", 0)
    base, thread = serve(server)
    try:
        status, _ = get_json(base.replace("127.0.0.1", "localhost") + "/admin/instances")
        assert status == 200
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        db.dispose()
