"""Messaging: messages, the store, consumers, distribution and the runtime that applies them."""

from messaging.config import load_settings, parse_duration, settings_from_mapping
from messaging.connection import connect
from messaging.consumers import ConsumerOptions, ConsumerSpec, handler
from messaging.distribution.assignor import assign
from messaging.errors import (
    CheckpointMoved,
    ConcurrentUpdate,
    ConfigError,
    DecodeError,
    OwnershipLost,
    ProjectionsError,
    RegistrationError,
    SchemaError,
    VersionConflict,
)
from messaging.hookspecs import hookimpl, hookspec
from messaging.kinds import ConsumerKind
from messaging.messages import Envelope, MessageRegistry, message, registry
from messaging.plugins import collect_consumers, create_plugin_manager
from messaging.routing.consumer import route_consumer
from messaging.runtime.context import HandlerContext
from messaging.runtime.instance import Instance
from messaging.runtime.retry import is_ambiguous
from messaging.settings import Distribution, InvalidSettings, Settings
from messaging.store.clock import Clock, DatabaseClock, ManualClock
from messaging.store.database import Database
from messaging.store.store import MessageStore, NewMessage, partition_hash, partition_of
from messaging.store.tenancy import UntranslatableStatement, physical_name

__all__ = [
    "CheckpointMoved",
    "Clock",
    "ConcurrentUpdate",
    "ConfigError",
    "ConsumerKind",
    "ConsumerOptions",
    "ConsumerSpec",
    "Database",
    "DatabaseClock",
    "DecodeError",
    "Distribution",
    "Envelope",
    "HandlerContext",
    "Instance",
    "InvalidSettings",
    "ManualClock",
    "MessageRegistry",
    "MessageStore",
    "NewMessage",
    "OwnershipLost",
    "ProjectionsError",
    "RegistrationError",
    "SchemaError",
    "Settings",
    "UntranslatableStatement",
    "VersionConflict",
    "assign",
    "collect_consumers",
    "connect",
    "create_plugin_manager",
    "handler",
    "hookimpl",
    "hookspec",
    "is_ambiguous",
    "load_settings",
    "message",
    "parse_duration",
    "partition_hash",
    "partition_of",
    "physical_name",
    "registry",
    "route_consumer",
    "settings_from_mapping",
]
