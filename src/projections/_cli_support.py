"""What the ``projections`` subcommands share: their settings, their database, their
reports printed as text or JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from messaging import Database, ProjectionsError, Settings, load_settings
from messaging.operations import database_for, parse_database_url


def command_settings(args: argparse.Namespace) -> Settings:
    """The settings a command's ``--config`` and ``--database`` give."""
    return load_settings(args.config, database=args.database)


def existing_database(settings: Settings) -> Database:
    """The database of a command that only reads or operates on what runs: a SQLite file
    that does not exist is an error naming it, never created empty."""
    url = parse_database_url(settings.database)
    if url.get_backend_name() == "sqlite" and url.database:
        path = Path(url.database)
        if not path.is_file():
            raise ProjectionsError(
                f"no database at {path.resolve()}: nothing has run here yet "
                "(pass --database or --config, or run an instance first)"
            )
    return database_for(settings)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def print_report(
    args: argparse.Namespace,
    build: Callable[[Database, Settings], dict[str, Any]],
    as_text: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """Print the report ``build`` reads (as JSON with ``--json``); return it."""
    settings = command_settings(args)
    db = existing_database(settings)
    try:
        db.prepare(reads_only=True)
        report = build(db, settings)
    finally:
        db.dispose()
    if args.json:
        print_json(report)
    else:
        print(as_text(report))
    return report


def use_app_dir(args: argparse.Namespace) -> None:
    """Let the application's modules be imported from ``--app-dir`` (first on the path)."""
    folder = os.path.abspath(args.app_dir)
    if not os.path.isdir(folder):
        raise ProjectionsError(f"--app-dir {args.app_dir}: no such folder")
    if folder not in sys.path:
        sys.path.insert(0, folder)
