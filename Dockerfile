# syntax=docker/dockerfile:1
# One image for every component: gpusteward extender | reclaimer | report | agent.
# `gpusteward sandbox` is a development command: .dockerignore leaves out the sources it
# builds from (sandbox/, deploy/), and it says so in one line when run here.
#
# Dependencies are installed with the same constraints file `make test` uses
# (pip install -c constraints.txt ...), so the image runs the versions the tests ran;
# tests/deploy/test_dockerfile.py checks that. Kubernetes probes do the health checking,
# so there is no HEALTHCHECK.
#
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#       -t ghcr.io/gpusteward/gpusteward:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/gpusteward
# Every dependency has a cp311 manylinux wheel, so no compiler is needed even here.
COPY pyproject.toml constraints.txt README.md LICENSE ./
COPY gpusteward ./gpusteward
RUN /opt/gpusteward/bin/pip install -c constraints.txt . \
 && /opt/gpusteward/bin/python -m compileall -q /opt/gpusteward \
 && /opt/gpusteward/bin/pip uninstall -y pip

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpusteward" \
      org.opencontainers.image.description="Kubernetes scheduler extender and idle-GPU reclaimer driven by live GPU telemetry" \
      org.opencontainers.image.source="https://github.com/gpusteward/gpusteward" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 gpusteward \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpusteward
COPY --from=build /opt/gpusteward /opt/gpusteward
# GPUSTEWARD_REVISION: `gpusteward --version` and gpusteward_build_info name the commit.
ENV PATH=/opt/gpusteward/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    GPUSTEWARD_REVISION=${REVISION}
# Numeric, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["gpusteward"]
