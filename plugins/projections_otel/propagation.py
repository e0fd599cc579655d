"""Trace context in message headers, with the W3C propagators (trace context and baggage)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from messaging import Envelope

_PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


def trace_headers(context: Context | None = None) -> dict[str, str]:
    """The current (or the given) trace context as message headers.

    Use it when appending, so that the handlers' spans continue the appender's trace::

        store.append(conn, topic, source, messages, headers=trace_headers())

    Empty when there is no active span and no baggage.
    """
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def context_of(envelope: Envelope | Mapping[str, Any]) -> Context:
    """The trace context an appender put in a message's headers (an envelope or headers).

    In a handler::

        with tracer.start_as_current_span("apply", context=context_of(ctx.envelope)):
            ...

    A message without trace headers gives an empty context: the span starts a new trace.
    """
    headers = envelope.headers if isinstance(envelope, Envelope) else envelope
    carrier = {key: value for key, value in headers.items() if isinstance(value, str)}
    return _PROPAGATOR.extract(carrier)
