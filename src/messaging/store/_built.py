"""Statements built once per table: kept in the table's ``info``, so that they live as
long as the table does (a module-wide cache would keep a dropped ``Database``'s tables,
and everything they reach, alive)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy import Table

P = ParamSpec("P")
T = TypeVar("T")

_BUILT = "projections.built"
_MAX_PER_TABLE = 64


def per_table(build: Callable[Concatenate[Table, P], T]) -> Callable[Concatenate[Table, P], T]:
    """``build(table, *args)`` made once per table and (hashable) ``args``."""

    def built(table: Table, /, *args: P.args, **kwargs: P.kwargs) -> T:
        cache: dict[Hashable, object] = table.info.setdefault(_BUILT, {})
        key = (build.__qualname__, args, tuple(sorted(kwargs.items())))
        found = cache.get(key)
        if found is None:
            if len(cache) >= _MAX_PER_TABLE:
                cache.clear()
            found = cache[key] = build(table, *args, **kwargs)
        return found  # type: ignore[return-value]

    functools.update_wrapper(built, build)
    return built
