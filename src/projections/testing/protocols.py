"""What the battery, the waiting check and the runner use of a cluster machine
(:class:`~projections.testing.machine.ClusterMachine`), as a protocol: they drive
machines without importing the machine's module, which imports them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from hypothesis.strategies import SearchStrategy
from sqlalchemy import Connection

from projections.testing.cluster import SimulatedCluster
from projections.testing.events import Append


class Machine(Protocol):
    """A cluster machine: its consumers and messages, its cluster, its read models."""

    consumers: ClassVar[Sequence[type]]
    messages: ClassVar[SearchStrategy[Append]]
    cluster: SimulatedCluster
    batches: dict[tuple[str, str], Append]

    def __init__(self, database_url: str | None = None) -> None: ...

    def teardown(self) -> None: ...

    def expected(self, messages: Sequence[object]) -> object: ...

    def actual(self, conn: Connection) -> object: ...

    def observe_ownership(self) -> None: ...
