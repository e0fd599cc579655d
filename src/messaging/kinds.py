"""The engine's seam for packages that build a kind of consumer on it, as ``sagas`` does.

A kind registers a :class:`ConsumerKind` (its worker, dispatcher, tables and hooks) and
a decorator that marks classes with it (``ARCHITECTURE.md``, "Adding a consumer kind").
What such a package needs of the engine is here, and nowhere else: a worker to extend
(:class:`ConsumerWorker`) and what it works with (claims, rows as read, the failure of a
message, the handler context), the message registry and its decoders, the store's fast
statements (:data:`fastpath`) and its column types and clock. The application's own
names are in :mod:`messaging`.
"""

from messaging._consumers import (
    DEFAULT_PARTITIONS,
    PAYLOAD_READS_ATTRIBUTE,
    PAYLOAD_UPCASTS_ATTRIBUTE,
    ConsumerSpec,
)
from messaging._json import make_dumps
from messaging._kinds import ConsumerKind, register_kind
from messaging._messages import MessageRegistry, quick_decoder
from messaging._structure import describe, strict_converter
from messaging._upcasting import Decode, Payload, UpcasterTable, upcasting_decoder
from messaging.applying._dispatch import Dispatcher, unreadable
from messaging.applying._worker import ConsumerWorker
from messaging.distribution._needs import clear_deadline
from messaging.distribution._ownership import Claim
from messaging.failures._poison import Poison
from messaging.store import _fastpath as fastpath
from messaging.store._clock import cached_now, now_params
from messaging.store._database import take_write_lock
from messaging.store._retry import is_transient
from messaging.store._rows import (
    PAYLOAD,
    PAYLOAD_VERSION,
    POSITION,
    SOURCE,
    TYPE,
    StoredRow,
    check_id,
    is_plain_id,
    partition_in,
    partition_of,
)
from messaging.store._schema import AS_GIVEN, LONG_TEXT, SECONDS

__all__ = [
    "AS_GIVEN",
    "DEFAULT_PARTITIONS",
    "LONG_TEXT",
    "PAYLOAD",
    "PAYLOAD_READS_ATTRIBUTE",
    "PAYLOAD_UPCASTS_ATTRIBUTE",
    "PAYLOAD_VERSION",
    "POSITION",
    "SECONDS",
    "SOURCE",
    "TYPE",
    "Claim",
    "ConsumerKind",
    "ConsumerSpec",
    "ConsumerWorker",
    "Decode",
    "Dispatcher",
    "MessageRegistry",
    "Payload",
    "Poison",
    "StoredRow",
    "UpcasterTable",
    "cached_now",
    "check_id",
    "clear_deadline",
    "describe",
    "fastpath",
    "is_plain_id",
    "is_transient",
    "make_dumps",
    "now_params",
    "partition_in",
    "partition_of",
    "quick_decoder",
    "register_kind",
    "strict_converter",
    "take_write_lock",
    "unreadable",
    "upcasting_decoder",
]
