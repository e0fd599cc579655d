"""``projections`` commands as real OS processes, forked from a server that imported the
framework once.

Each ``python -m projections.cli`` spends ~0.8 s of CPU importing Python, SQLAlchemy and
the framework before it does anything; the suite starts hundreds of them on two cores.
A fork server (one per pytest worker, started on first use) imports them once and forks a
child per command. The child is a process of its own like any other (its own pid, memory,
connections, file locks and signals; SIGKILL kills it), with the environment, working
directory and standard streams the caller gives, and runs ``projections.cli.main`` as
``python -m projections.cli`` would. Application modules (the tests' apps) are imported
by the child, never by the server, so each child reads its own environment at import.

:func:`spawn` returns a :class:`Forked`, which answers what the tests ask of a
``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
``kill``, ``returncode``); :func:`run` is ``subprocess.run`` with captured output.
``PROJECTIONS_TEST_SPAWN=fork`` (what ``tests/conftest.py`` sets) chooses the fork server;
otherwise (the benchmarks, which measure processes as users start them) each command is
started with ``subprocess``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

SPAWN_ENV = "PROJECTIONS_TEST_SPAWN"
_MESSAGE = 1 << 20


class Process(Protocol):
    """What tests ask of a started command: a :class:`Forked` or a ``subprocess.Popen``."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class Forked:
    """A command forked by the server: the parts of ``subprocess.Popen`` tests use."""

    def __init__(self, pid: int, status: socket.socket, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._status = status
        self._buffer = b""

    def poll(self) -> int | None:
        """The exit code if it ended (negative: the signal that ended it), else None."""
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> int | None:
        while self.returncode is None:
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                return None
            chunk = self._status.recv(64)
            if not chunk:
                raise RuntimeError(f"the fork server lost child {self.pid}")
            self._buffer += chunk
            if self._buffer.endswith(b"\n"):
                self.returncode = int(self._buffer)
                self._status.close()
        return self.returncode


class _Client:
    """The pytest worker's end of its fork server."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        support = str(Path(__file__).resolve().parent)
        path = os.pathsep.join(filter(None, [support, os.environ.get("PYTHONPATH")]))
        self._server = subprocess.Popen(
            [sys.executable, "-c", f"import forked; forked.serve({theirs.fileno()})"],
            pass_fds=(theirs.fileno(),),
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._control = ours
        self._lock = threading.Lock()

    def spawn(
        self, args: list[str], env: Mapping[str, str], cwd: str, streams: Sequence[int]
    ) -> Forked:
        ours, theirs = socket.socketpair()
        spec = {"args": args, "env": dict(env), "cwd": cwd}
        with self._lock:
            socket.send_fds(self._control, [json.dumps(spec).encode()], [theirs.fileno(), *streams])
        theirs.close()
        pid = b""
        while not pid.endswith(b"\n"):
            chunk = ours.recv(64)
            if not chunk:
                raise RuntimeError("the fork server did not start the command")
            pid += chunk
        return Forked(int(pid), ours, ["projections", *args])


_client: _Client | None = None


def spawn(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: int = 0,
    stdout: int = 1,
    stderr: int = 2,
) -> Process:
    """Start ``projections ARGS`` (``python -m projections.cli ARGS``) with ``env`` as its
    whole environment (this process's when None), in ``cwd``, with the given file
    descriptors as its standard streams."""
    global _client
    env = dict(os.environ if env is None else env)
    where = str(cwd or os.getcwd())
    if os.environ.get(SPAWN_ENV) != "fork":
        return subprocess.Popen(
            [sys.executable, "-m", "projections.cli", *args],
            env=env,
            cwd=where,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )
    if _client is None:
        _client = _Client()
    return _client.spawn(list(args), env, where, (stdin, stdout, stderr))


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` of ``projections ARGS`` with its output captured as text."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        process = spawn(args, env=env, cwd=cwd, stdin=in_read, stdout=out_write, stderr=err_write)
    finally:
        for fd in (in_read, out_write, err_write):
            os.close(fd)
    outputs: dict[int, bytes] = {}

    def drain(fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            outputs[fd] = stream.read()

    readers = [threading.Thread(target=drain, args=(fd,)) for fd in (out_read, err_read)]
    for reader in readers:
        reader.start()
    with os.fdopen(in_write, "wb") as stdin:
        if input is not None:
            stdin.write(input.encode())
    for reader in readers:
        reader.join(timeout)
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return subprocess.CompletedProcess(
        ["projections", *args],
        code,
        outputs.get(out_read, b"").decode(),
        outputs.get(err_read, b"").decode(),
    )


# -- the server -----------------------------------------------------------------------


def serve(fd: int) -> None:
    """Import the framework, then fork a child per request on the socket ``fd`` until
    the client goes away (its children still running are killed then)."""
    import projections.cli  # noqa: F401  (the imports the server exists for)
    import sagas  # noqa: F401

    control = socket.socket(fileno=fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    try:
        while True:
            ready, _, _ = select.select([control.fileno(), wake_read], [], [])
            if wake_read in ready:
                os.read(wake_read, 4096)
                _reap(children)
            if control.fileno() in ready:
                message, fds, _, _ = socket.recv_fds(control, _MESSAGE, 4)
                if not message:
                    return
                status = socket.socket(fileno=fds[0])
                pid = os.fork()
                if pid == 0:
                    control.close()
                    status.close()
                    for end in (wake_read, wake_write):
                        os.close(end)
                    _child(json.loads(message), fds[1:])
                for stream in fds[1:]:
                    os.close(stream)
                status.sendall(f"{pid}\n".encode())
                children[pid] = status
                _reap(children)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell the client of each child that ended, with its exit code."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        told = children.pop(pid, None)
        if told is not None:
            with contextlib.suppress(OSError):  # (the client let go of it)
                told.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            told.close()


def _child(spec: dict[str, Any], streams: list[int]) -> None:
    """Become ``python -m projections.cli ARGS`` with the spec's environment, directory
    and streams; never returns."""
    code: Any = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, stream in enumerate(streams):
            os.dup2(stream, target)
        for stream in set(streams) - {0, 1, 2}:
            os.close(stream)
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(spec["env"])
        sys.path[:0] = [p for p in spec["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        line = 1 if spec["env"].get("PYTHONUNBUFFERED") else -1
        sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's own)
        sys.stdout = open(1, "w", buffering=line, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = ["projections", *spec["args"]]
        from projections.cli import main

        code = main(spec["args"])
    except SystemExit as exc:
        code = exc.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            for thread in threading.enumerate():  # as the interpreter does at its exit
                if thread is not threading.current_thread() and not thread.daemon:
                    thread.join()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            status = code if isinstance(code, int) else (0 if code is None else 1)
            os._exit(status)
