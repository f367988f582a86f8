# One image for the operator, the workers and the migrations: `jobpool operator`,
# `jobpool run ...`, `jobpool migrate`.

# -- build: the wheel of jobpool and of everything it needs ---------------------------
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir build==1.2.2
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m build --wheel --outdir /dist \
 && pip wheel --no-cache-dir --wheel-dir /wheels /dist/jobpool-*.whl

# -- runtime: the wheels installed, no build tools, a non-root user ---------------------
FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 jobpool \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin jobpool
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels jobpool \
 && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    JOBPOOL_METRICS_PORT=9108 \
    JOBPOOL_DATA_DIR=/tmp/jobpool
USER 10001:10001
WORKDIR /tmp
EXPOSE 9108 8080
ENTRYPOINT ["jobpool"]
CMD ["--help"]
