"""The packages built on the engine use it through its public modules: ``sagas`` (a kind
of consumer), ``projections`` (the operator tools and the testing kit) and the plugins
import ``messaging``, ``messaging.kinds`` and ``messaging.operations``, never a private
module of the engine (``messaging._x``, ``messaging.store._y``) nor a private name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILT_ON_THE_ENGINE = [ROOT / "src" / "sagas", ROOT / "src" / "projections", ROOT / "plugins"]


def private_engine_imports(folders: list[Path]) -> list[str]:
    """``file:line module.name`` for each import of a private module or name of
    ``messaging`` under ``folders``."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("messaging"):
                    module = node.module or ""
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    module, names = "", [a.name for a in node.names]
                else:
                    continue
                dotted = [f"{module}.{n}" if module else n for n in names]
                for name in dotted:
                    parts = name.split(".")
                    if parts[0] == "messaging" and any(p.startswith("_") for p in parts):
                        found.append(f"{path.relative_to(folder.parent)}:{node.lineno} {name}")
    return found


def test_what_is_built_on_the_engine_uses_its_public_modules() -> None:
    assert private_engine_imports(BUILT_ON_THE_ENGINE) == []


def test_a_private_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "kind.py").write_text(
        "from messaging.kinds import Claim\n"
        "from messaging.applying._worker import ConsumerWorker\n"
        "import messaging._settings\n"
        "from messaging import _json\n",
        encoding="utf-8",
    )
    found = [f.split(" ", 1)[1] for f in private_engine_imports([tmp_path])]
    assert found == [
        "messaging.applying._worker.ConsumerWorker",
        "messaging._settings",
        "messaging._json",
    ]


def test_every_public_error_is_named_as_it_is_imported() -> None:
    """A halted partition's reason, a CLI line and a traceback name ``messaging.X``, the
    name a user imports, never the private module that defines it."""
    import traceback

    import messaging

    errors = [
        getattr(messaging, n)
        for n in messaging.__all__
        if isinstance(getattr(messaging, n), type)
        and issubclass(getattr(messaging, n), messaging.ProjectionsError)
    ]
    assert len(errors) >= 15
    assert [e for e in errors if e.__module__ != "messaging"] == []
    shown = traceback.format_exception_only(
        messaging.DecodeError("bad json", position=7, type_name="t")
    )
    assert shown == [
        "messaging.DecodeError: cannot decode message at position 7 of type 't': bad json\n"
    ]
