"""OpenTelemetry set-up shared by the engine, the sidecar and the client.

Tracing is always wired (one server interceptor per gRPC service, spans per
RPC and per engine step, context propagated in gRPC metadata); spans are
exported only when configured:

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` set → OTLP/gRPC exporter (Jaeger, Tempo, …);
* ``NINFER_TRACE_CONSOLE=1`` → spans printed to stderr as each ends (synchronously: the sidecar's
  stdout is discarded by the engine and it may be killed, so nothing waits in a batch);
* otherwise spans are created and dropped (near-zero cost).

Where the OpenTelemetry packages are not installed (e.g. the bare GPU box),
every helper degrades to a no-op.
"""
from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from typing import Any, Iterable

_configured = False
_silent_provider: Any = None  # the provider setup_tracing installed without any exporter (spans go nowhere)


def setup_tracing(service_name: str) -> None:
    """Install a global TracerProvider for ``service_name`` (idempotent)."""
    global _configured, _silent_provider
    if _configured:
        return
    _configured = True
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporting = False
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            exporting = True
        except ImportError:
            pass
    if os.environ.get("NINFER_TRACE_CONSOLE") == "1":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        exporting = True
    if not exporting:
        _silent_provider = provider
    trace.set_tracer_provider(provider)


def tracing_active() -> bool:
    """True when spans go somewhere: :func:`setup_tracing` installed an exporter, or the application
    installed a tracer provider of its own.  False without OpenTelemetry, with the default (proxy/no-op)
    provider, or with the exporter-less provider of :func:`setup_tracing`.  One global read: hot paths
    (the engine's per-step span and its links) check it to cost nothing when tracing is off."""
    try:
        from opentelemetry import trace
    except ImportError:
        return False
    provider = trace.get_tracer_provider()
    return not (provider is _silent_provider
                or isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)))


def get_tracer(name: str) -> Any:
    """A tracer, or a no-op stand-in whose ``start_as_current_span`` is a null context."""
    try:
        from opentelemetry import trace

        return trace.get_tracer(name)
    except ImportError:
        return _NoopTracer()


class _NoopTracer:
    def start_as_current_span(self, *_a: Any, **_k: Any) -> Any:
        return nullcontext(_NoopSpan())


class _NoopSpan:
    def set_attribute(self, *_a: Any) -> None:
        pass

    def set_status(self, *_a: Any) -> None:
        pass

    def record_exception(self, *_a: Any) -> None:
        pass

    def get_span_context(self) -> None:
        return None


def mark_error(span: Any, error_type: str, message: str) -> None:
    """Set ``span``'s status to ERROR with ``message`` and the semantic-convention ``error.type``
    attribute (e.g. the request's ``ErrorKind``)."""
    span.set_attribute("error.type", error_type)
    try:
        from opentelemetry.trace import Status, StatusCode
    except ImportError:
        return
    span.set_status(Status(StatusCode.ERROR, message[:512]))


def links_to(span_contexts: Iterable[Any]) -> list[Any]:
    """OpenTelemetry span links to the valid ``span_contexts`` (e.g. an engine step's rows' request
    spans; a context is None without tracing). Empty without the OpenTelemetry packages."""
    try:
        from opentelemetry.trace import Link
    except ImportError:
        return []
    out, seen = [], set()
    for ctx in span_contexts:
        if ctx is None or not getattr(ctx, "is_valid", False) or ctx.span_id in seen:
            continue
        seen.add(ctx.span_id)
        out.append(Link(ctx))
    return out


def server_interceptors() -> list[Any]:
    """gRPC server interceptors that open a span per RPC (empty if unavailable)."""
    try:
        from opentelemetry.instrumentation.grpc import server_interceptor

        return [server_interceptor()]
    except ImportError:
        return []


def instrument_channel(channel: Any) -> Any:
    """Wrap a client channel so calls open spans and propagate trace context (no-op if unavailable)."""
    try:
        from opentelemetry.instrumentation.grpc import client_interceptor
        from opentelemetry.instrumentation.grpc.grpcext import intercept_channel

        return intercept_channel(channel, client_interceptor())
    except ImportError:
        return channel


# Bucket bounds (seconds) of every ``*_seconds`` histogram: 0.25 ms .. 2 min. OpenTelemetry's
# defaults (0, 5, 10, 25, ... 10000) are scaled for milliseconds and put every engine step into
# the first bucket (issue 14 (9)).
SECONDS_BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 120.0)


def setup_metrics(service_name: str, prometheus_port: int = 0, host: str = "127.0.0.1") -> bool:
    """Install a global MeterProvider; with ``prometheus_port`` > 0 also serve ``/metrics`` there.

    Histograms whose name ends in ``_seconds`` get :data:`SECONDS_BUCKETS`.
    Returns True when a Prometheus endpoint was started. Without the
    OpenTelemetry packages this is a no-op returning False.
    """
    try:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import Histogram, MeterProvider
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        return False
    views = [View(instrument_type=Histogram, instrument_name="*_seconds",
                  aggregation=ExplicitBucketHistogramAggregation(SECONDS_BUCKETS))]
    readers = []
    started = False
    if prometheus_port > 0:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server

            start_http_server(prometheus_port, addr=host)
            readers.append(PrometheusMetricReader())
            started = True
        except ImportError:
            pass
    metrics.set_meter_provider(MeterProvider(resource=Resource.create({"service.name": service_name}),
                                             metric_readers=readers, views=views))
    return started


def get_meter(name: str) -> Any:
    """A meter, or None when OpenTelemetry is unavailable."""
    try:
        from opentelemetry import metrics

        return metrics.get_meter(name)
    except ImportError:
        return None
