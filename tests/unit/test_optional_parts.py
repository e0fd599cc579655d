"""Optional parts stay optional: without the OpenTelemetry SDK (the ``otel`` extra) the
pytest plugin, the telemetry plugin and the framework still import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCK_SDK = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoSdk(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)")
            return None

    sys.meta_path.insert(0, NoSdk())
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_SDK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_blocker_really_blocks_the_sdk() -> None:
    done = _run("import opentelemetry.sdk.trace")
    assert done.returncode != 0
    assert "blocked" in done.stderr


def test_pytest_plugin_and_telemetry_plugin_import_without_the_sdk() -> None:
    done = _run(
        """
        import projections.testing.plugin, projections_otel, messaging, projections, sagas
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
