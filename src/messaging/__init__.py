"""Messaging: messages, the store, and the engine every consumer kind shares.

The names below are what an application imports: declaring messages and route
consumers, handling them, appending, configuring, running an instance in-process, and
the errors worth catching. Everything else is internal, in private modules
(``messaging.store._rows.partition_of``, ``messaging.store._clock.ManualClock``, ...).
"""

from messaging._config import load_settings
from messaging._connection import connect
from messaging._consumers import ConsumerOptions, handler, mark_consumer
from messaging._errors import (
    ApplyTimedOut,
    CheckpointMoved,
    ConcurrentUpdate,
    ConfigError,
    DecodeError,
    OperationError,
    OwnershipLost,
    ProjectionsError,
    RegistrationError,
    SchemaError,
    Unanswered,
    UnknownConsumer,
    UnknownPayloadVersion,
    VersionConflict,
    WaitRefused,
    WaitTimeout,
)
from messaging._hookspecs import hookimpl, hookspec
from messaging._kinds import ConsumerKind, register_kind
from messaging._messages import Envelope, message, rename, upcaster
from messaging._plugins import collect_consumers, create_plugin_manager
from messaging._settings import (
    AdminSettings,
    ConflictRetrySettings,
    ConsumerGroupSettings,
    ConsumerOverride,
    ConsumerSettings,
    Distribution,
    ExecutorSettings,
    HealthSettings,
    InvalidSettings,
    MessagingSettings,
    OnFailure,
    Settings,
)
from messaging._states import Severity, Verdict
from messaging.applying._context import HandlerContext, MessageContext
from messaging.routing._consumer import route_consumer
from messaging.runtime._instance import Instance
from messaging.store._database import Database
from messaging.store._retry import is_ambiguous
from messaging.store._rows import NewMessage
from messaging.store._store import MessageStore
from messaging.store._tenancy import UntranslatableStatement
from messaging.store._tokens import (
    Appended,
    ConsistencyToken,
    InvalidToken,
    Sent,
    TokenNotKnown,
    Written,
)
from messaging.waits._progress import Behind, Progress
from messaging.waits._waits import wait_for, wait_for_async, wait_for_copy

__all__ = [
    "AdminSettings",
    "Appended",
    "ApplyTimedOut",
    "Behind",
    "CheckpointMoved",
    "ConcurrentUpdate",
    "ConfigError",
    "ConflictRetrySettings",
    "ConsistencyToken",
    "ConsumerGroupSettings",
    "ConsumerKind",
    "ConsumerOptions",
    "ConsumerOverride",
    "ConsumerSettings",
    "Database",
    "DecodeError",
    "Distribution",
    "Envelope",
    "ExecutorSettings",
    "HandlerContext",
    "HealthSettings",
    "Instance",
    "InvalidSettings",
    "InvalidToken",
    "MessageContext",
    "MessageStore",
    "MessagingSettings",
    "NewMessage",
    "OnFailure",
    "OperationError",
    "OwnershipLost",
    "Progress",
    "ProjectionsError",
    "RegistrationError",
    "SchemaError",
    "Sent",
    "Settings",
    "Severity",
    "TokenNotKnown",
    "Unanswered",
    "UnknownConsumer",
    "UnknownPayloadVersion",
    "UntranslatableStatement",
    "Verdict",
    "VersionConflict",
    "WaitRefused",
    "WaitTimeout",
    "Written",
    "collect_consumers",
    "connect",
    "create_plugin_manager",
    "handler",
    "hookimpl",
    "hookspec",
    "is_ambiguous",
    "load_settings",
    "mark_consumer",
    "message",
    "register_kind",
    "rename",
    "route_consumer",
    "upcaster",
    "wait_for",
    "wait_for_async",
    "wait_for_copy",
]

for _name in __all__:  # a reason, CLI line or traceback names messaging.X, as imported
    _value = globals()[_name]
    if isinstance(_value, type) and issubclass(_value, ProjectionsError):
        _value.__module__ = __name__
del _name, _value
