"""OpenTelemetry traces, optional.

Installed with the ``[otel]`` extra and configured only by the standard ``OTEL_*`` variables
(``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SDK_DISABLED``, ...). Without the package, without an
exporter configured, or with the SDK disabled, ``span()`` is a no-op context manager and costs
one attribute check: the hot paths call it unconditionally.

Spans: a server span per webhook and API request (the caller's ``traceparent`` honoured), a
``webhook.commit`` child while the request waits for its group commit, one ``inbox.group_commit``
span per batch written, linked to every request span in it; ``consumer.batch`` per consumer
batch, ``sender.batch`` per sender batch with a ``provider.send`` client span per message.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gateway import __version__

log = logging.getLogger(__name__)

SERVICE_NAME = "whatsapp-gateway"

_tracer: Any = None
_provider: Any = None
enabled = False


def configure(environ: Mapping[str, str], *, exporter: Any = None) -> bool:
    """Set up tracing from ``OTEL_*`` (once per process); returns whether spans are recorded.

    ``exporter`` replaces the one the variables name (tests pass an in-memory exporter).
    """
    global _tracer, _provider, enabled
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    endpoint_set = any(k.startswith("OTEL_EXPORTER_OTLP_") and k.endswith("ENDPOINT") for k in environ)
    name = environ.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint_set else "none").strip().lower()
    if exporter is None and name == "none":
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning(
            "OTEL_* asks for traces but OpenTelemetry is not installed: "
            "pip install 'whatsapp-webhook-gateway[otel]'; tracing is off"
        )
        return False
    if exporter is None:
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http")
                return False
            exporter = OTLPSpanExporter()  # endpoint, headers, timeout: from OTEL_EXPORTER_OTLP_*
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console, none)", name[:40])
            return False
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", SERVICE_NAME)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("gateway", __version__)
    enabled = True
    log.info("OpenTelemetry traces on (exporter: %s)", type(exporter).__name__)
    return True


def shutdown() -> None:
    """Flush and stop (at process exit)."""
    global _tracer, _provider, enabled
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None
    enabled = False


def span(
    name: str, *, kind: str = "internal", links: Sequence[Any] = (), root: bool = False, **attributes: Any
) -> Any:
    """A context manager: a span under the current one (``root``: a new trace), or nothing
    when tracing is off."""
    if _tracer is None:
        return contextlib.nullcontext()
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind

    return _tracer.start_as_current_span(
        name,
        context=Context() if root else None,
        kind=getattr(SpanKind, kind.upper()),
        attributes={k: v for k, v in attributes.items() if v is not None},
        links=[Link(c) for c in links if c is not None],
    )


@contextlib.contextmanager
def server_span(method: str, route: str, headers: Mapping[str, str]) -> Iterator[Any]:
    """The span of one HTTP request, continuing the caller's trace (W3C ``traceparent``)."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        f"{method} {route}",
        kind=SpanKind.SERVER,
        context=propagate.extract(headers),
        attributes={"http.request.method": method, "http.route": route},
    ) as current:
        yield current


def current_context() -> Any:
    """The current span's context (to link a batch span to it), or None when tracing is off."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return ctx if ctx.is_valid else None
