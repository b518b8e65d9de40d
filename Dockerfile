# syntax=docker/dockerfile:1
# compaction-proxy: multi-stage build, slim runtime, non-root, offline tokenizers.

# Python 3.11: the release CI runs the whole suite on (3.12 and 3.13 run too, and measured no
# faster here: docs/perf.md, "Python releases").
FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY compaction_proxy ./compaction_proxy
# The tokenizer files ship inside litellm; loading them here makes a broken install fail the
# build instead of a request (the image never reaches the network for them).
RUN pip install . && python -m compaction_proxy.metering.tokenizers

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin proxy
COPY --from=build /opt/venv /opt/venv
COPY config/proxy.yaml /etc/compaction-proxy/proxy.yaml
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    COMPACTION_PROXY_CONFIG=/etc/compaction-proxy/proxy.yaml \
    COMPACTION_PROXY_HOST=0.0.0.0 \
    COMPACTION_PROXY_PORT=8080 \
    COMPACTION_PROXY_METRICS_PORT=9090
USER 10001
EXPOSE 8080 9090
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-m", "compaction_proxy.ops.healthcheck"]
ENTRYPOINT ["compaction-proxy"]
CMD ["serve"]
