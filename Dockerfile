# One image for the operator, the workers, the migrations and the admin API: `jobpool
# operator`, `jobpool run ...`, `jobpool migrate`, `jobpool api`. It installs the extras
# those need, and `otel` (traces, when OTEL_* variables ask for them: docs/tracing.md); not
# `local` (embedded PostgreSQL, demo SMTP): a pod always has JOBPOOL_DSN.

# -- build: the wheel of jobpool and of everything it needs ---------------------------
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir build==1.2.2
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m build --wheel --outdir /dist \
 && pip wheel --no-cache-dir --wheel-dir /wheels "$(ls /dist/jobpool-*.whl)[worker,api,operator,otel]"

# -- runtime: the wheels installed, no build tools, a non-root user ---------------------
FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 jobpool \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin jobpool
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels "jobpool[worker,api,operator,otel]" \
 && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    JOBPOOL_METRICS_PORT=9108
USER 10001:10001
WORKDIR /tmp
EXPOSE 9108 8080
ENTRYPOINT ["jobpool"]
CMD ["--help"]
