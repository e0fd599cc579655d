"""Messaging: messages, the store, and the engine every consumer kind shares.

The names below are what an application imports: declaring messages and route
consumers, handling them, appending, configuring, running an instance in-process, and
the errors worth catching. Everything else is imported from its module
(``messaging.store.store.partition_of``, ``messaging.store.clock.ManualClock``, ...).
"""

from messaging.config import load_settings
from messaging.connection import connect
from messaging.consumers import handler
from messaging.errors import (
    CheckpointMoved,
    ConcurrentUpdate,
    ConfigError,
    DecodeError,
    OperationError,
    OwnershipLost,
    ProjectionsError,
    RegistrationError,
    SchemaError,
    VersionConflict,
)
from messaging.hookspecs import hookimpl, hookspec
from messaging.messages import Envelope, message
from messaging.plugins import collect_consumers, create_plugin_manager
from messaging.routing.consumer import route_consumer
from messaging.runtime.context import HandlerContext, MessageContext
from messaging.runtime.instance import Instance
from messaging.settings import Distribution, InvalidSettings, Settings
from messaging.store.database import Database
from messaging.store.retry import is_ambiguous
from messaging.store.store import MessageStore, NewMessage
from messaging.store.tenancy import UntranslatableStatement

__all__ = [
    "CheckpointMoved",
    "ConcurrentUpdate",
    "ConfigError",
    "Database",
    "DecodeError",
    "Distribution",
    "Envelope",
    "HandlerContext",
    "Instance",
    "InvalidSettings",
    "MessageContext",
    "MessageStore",
    "NewMessage",
    "OperationError",
    "OwnershipLost",
    "ProjectionsError",
    "RegistrationError",
    "SchemaError",
    "Settings",
    "UntranslatableStatement",
    "VersionConflict",
    "collect_consumers",
    "connect",
    "create_plugin_manager",
    "handler",
    "hookimpl",
    "hookspec",
    "is_ambiguous",
    "load_settings",
    "message",
    "route_consumer",
]
