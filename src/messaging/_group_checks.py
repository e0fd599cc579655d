"""The checks of the consumer kinds' settings sections (``projections``, ``routing``,
``sagas``...): sections of no kind, per-consumer overrides that a kind does not take,
values out of range. Part of :func:`messaging._settings.validate`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from messaging._kinds import registered_kinds

if TYPE_CHECKING:
    from messaging._settings import Settings


def group_problems(settings: Settings) -> list[str]:
    """One line per problem of the consumer kinds' sections of ``settings``."""
    from messaging._settings import OnFailure, consumer_sections

    problems: list[str] = []
    sections = consumer_sections()
    no_limit = {
        kind.settings_group: kind.no_concurrency_limit
        for kind in registered_kinds()
        if kind.no_concurrency_limit
    }
    for section, group in sorted(settings.consumer_groups.items()):
        if group.max_parked_sources < 1:
            problems.append(
                f"{section}.max-parked-sources ({group.max_parked_sources}) must be 1 or more"
            )
        if section not in sections:
            problems.append(
                f"{section}: no consumer kind is configured under this section "
                f"(sections: {', '.join(sections)})"
            )
        parking = [k.value for k in registered_kinds() if k.settings_group == section and k.parks]
        chosen = [(f"{section}.on-failure", group.on_failure)] + [
            (f"{section}.consumers.{name}.on-failure", o.on_failure)
            for name, o in group.consumers.items()
        ]
        if section in sections and not parking:
            problems += [
                f"{key} (park-source) is not supported: {section} halt their partition on a failure"
                for key, value in chosen
                if value is OnFailure.PARK_SOURCE
            ]
        for name, override in group.consumers.items():
            limit = override.concurrency_limit
            key = f"{section}.consumers.{name}.concurrency-limit"
            if limit is not None and section in no_limit:
                problems.append(f"{key} ({limit}) is not supported: {no_limit[section]}")
            elif limit is not None and limit < 1:
                problems.append(f"{key} ({limit}) must be 1 or more")
            size = override.batch_size
            if size is not None and size < 1:
                problems.append(f"{section}.consumers.{name}.batch-size ({size}) must be 1 or more")
            kept = override.retired_versions
            if kept is not None and kept < 0:
                problems.append(
                    f"{section}.consumers.{name}.retired-versions ({kept}) must be 0 or more"
                )
        if group.retired_versions < 0:
            problems.append(
                f"{section}.retired-versions ({group.retired_versions}) must be 0 or more"
            )
        timeouts = [(f"{section}.apply-timeout", group.apply_timeout)] + [
            (f"{section}.consumers.{name}.apply-timeout", o.apply_timeout)
            for name, o in sorted(group.consumers.items())
        ]
        problems += [
            p
            for key, value in timeouts
            if value is not None
            for p in _apply_timeout(key, value, settings)
        ]
    return problems


def _apply_timeout(key: str, timeout: float, settings: Settings) -> list[str]:
    """An apply timeout must leave a batch time to wait out a lock held by a frozen
    instance (the lock-wait bound, which conflict-retry retries): a shorter one would halt
    partitions for a transient conflict. (A long batch never makes its instance or its
    partitions stale: the heartbeat runs apart, so there is no other bound.)"""
    from messaging._settings import format_duration as d
    from messaging.store._database import LOCK_WAIT_FRACTION, lock_wait_bound

    if not timeout > 0:
        return [f"{key} ({d(timeout)}) must be above 0s"]
    stale = settings.messaging.consumer.stale_instance_timeout
    bound = lock_wait_bound(stale)
    if timeout > bound:
        return []
    return [
        f"{key} ({d(timeout)}) must be above the lock-wait bound: "
        f"messaging.consumer.stale-instance-timeout ({d(stale)}) / {LOCK_WAIT_FRACTION}, "
        f"at least 1s = {d(bound)}"
    ]
