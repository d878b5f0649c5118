# licensectl controller image.
#
#   docker build -t registry.example.com/platform/licensectl:0.1.0 .
#
# Python slim base, the package installed into a virtualenv in a build stage and copied into a
# clean final stage (no pip, no build files). Runs as uid/gid 65532 (non-root, no home needed) and
# works with a read-only root filesystem: it writes nothing but logs to stdout.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/licensectl
WORKDIR /src
COPY pyproject.toml README.md ./
COPY licensectl ./licensectl
RUN /opt/licensectl/bin/pip install . \
 && /opt/licensectl/bin/licensectl --version

FROM python:${PYTHON_VERSION}-slim
ENV PATH=/opt/licensectl/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/licensectl /opt/licensectl
USER 65532:65532
# metrics: /metrics, /healthz, /readyz; reports: POST /v1/reports from guests.
EXPOSE 8080 8443
ENTRYPOINT ["licensectl"]
CMD ["run"]
