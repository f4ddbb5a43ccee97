# Router image: `disagg router` (the KV-cache-aware router) on Python slim, non-root, with the
# `router` extra only: no vLLM, torch or NIXL inside. Use it as spec.router.image; without that
# field the router runs from the serving image (connector/Dockerfile), which holds the same deps.
#
# Build from the repository root:
#   docker build -f connector/router.Dockerfile -t ghcr.io/OWNER/disagg-router:0.1.0 .
#   docker push ghcr.io/OWNER/disagg-router:0.1.0
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY connector ./connector
COPY tools ./tools
RUN python -m pip wheel --no-deps --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG DISAGG_VERSION=0.1.0
LABEL org.opencontainers.image.title="disagg-router" \
      org.opencontainers.image.description="KV-cache-aware router for vLLM prefill/decode disaggregated serving" \
      org.opencontainers.image.version="${DISAGG_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# The `router` extra only (fastapi, uvicorn[standard], aiohttp, redis, prometheus-client and
# kubernetes for EndpointSlice discovery).
COPY --from=wheel /wheels /tmp/wheels
RUN WHEEL="$(echo /tmp/wheels/disagg-*.whl)" \
    && python -m pip install --no-cache-dir "${WHEEL}[router]" \
    && rm -rf /tmp/wheels \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin disagg

ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["disagg"]
CMD ["router", "--help"]
