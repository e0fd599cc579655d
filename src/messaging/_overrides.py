"""Check per-consumer overrides against the consumers an instance actually declares.

An override for a name nobody declared, or for a consumer under another kind's
section, would otherwise be ignored without a word.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from messaging._consumers import ConsumerSpec
from messaging._errors import ConfigError
from messaging._settings import Settings

__all__ = ["check_overrides"]


def check_overrides(settings: Settings, specs: Sequence[ConsumerSpec]) -> None:
    """Raise :class:`ConfigError` listing every override that fits no declared consumer.

    Each line names the override's full key path; an unknown name gets the closest
    declared name of its section (else of any section), a consumer under the wrong
    section gets the section it belongs to. A consumer of a kind that every
    instance runs whole (not transactional) takes neither ``distribution`` nor
    ``concurrency-limit``.
    """
    by_name = {spec.name: spec for spec in specs}
    problems: list[str] = []
    for section, group in sorted(settings.consumer_groups.items()):
        for name, override in group.consumers.items():
            key = f"{section}.consumers.{name}"
            spec = by_name.get(name)
            if spec is None:
                problems.append(
                    f"{key}: no consumer named {name!r} is declared{_hint(name, section, specs)}"
                )
                continue
            home, kind = spec.kind.settings_group, spec.kind.article
            if home != section:
                problems.append(f"{key}: {name!r} is {kind}; configure it under {home}.consumers")
            elif not spec.kind.transactional and (
                override.distribution is not None or override.concurrency_limit is not None
            ):
                problems.append(
                    f"{key}: {name!r} is {kind}, which every instance runs "
                    "whole: it takes neither distribution nor concurrency-limit"
                )
    if problems:
        raise ConfigError("invalid configuration:\n" + "\n".join(f"  {p}" for p in problems))


def _hint(name: str, section: str, specs: Sequence[ConsumerSpec]) -> str:
    """``"; did you mean 'x'?"`` with the closest declared name, or a list of what exists."""
    own = [s.name for s in specs if s.kind.settings_group == section]
    close = difflib.get_close_matches(name, own, n=1) or difflib.get_close_matches(
        name, [s.name for s in specs], n=1
    )
    if close:
        return f"; did you mean {close[0]!r}?"
    if own:
        return f" (declared there: {', '.join(sorted(own))})"
    return " (no consumer of this kind is declared)"
