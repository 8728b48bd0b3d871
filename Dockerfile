# Production image: `gateway serve` (or consume, send, forward, migrate) against DATABASE_URL.
#
# The base is pinned by digest (the multi-architecture index of python:3.11.14-slim-bookworm,
# as pinned by several public projects in late 2026; this repo's CI has no Docker engine to
# resolve it). To move to a newer base, re-pin both lines from the registry:
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # -> Digest: sha256:...
ARG BASE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY sql ./sql
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${BASE}
# JSON log lines for the container runtime; no embedded PostgreSQL (the [embedded] extra is not
# installed): without DATABASE_URL the gateway refuses to start instead of keeping its data in
# the container's writable layer.
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080 \
    GATEWAY_METRICS_PORT=9100 \
    GATEWAY_LOG_FORMAT=json \
    GATEWAY_EMBEDDED=0
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /app --create-home gateway
USER gateway
WORKDIR /app
# 8080: webhooks and the send API, for the public proxy. 9100: /metrics and /healthz, for
# Prometheus on the inside network only (/metrics names destinations and phone-number ids).
EXPOSE 8080 9100
# /readyz on the configured port (GATEWAY_PORT): database reachable and schema current.
# The workers (consume, send, forward) serve /healthz on GATEWAY_METRICS_PORT instead; compose
# gives them their own health check.
HEALTHCHECK --interval=10s --timeout=3s --start-period=40s --retries=3 \
    CMD ["python", "-c", "import os,sys,urllib.request; p=os.environ.get('GATEWAY_PORT','8080'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{p}/readyz', timeout=2).status != 200)"]
CMD ["gateway", "serve"]
