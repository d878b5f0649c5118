# licensectl controller image recipe.
#
#   docker build -t registry.example.com/platform/licensectl:0.2.1 .
#
# Reproducible: every Python package comes from a hash-pinned lock (requirements.lock for the
# runtime, requirements-build.lock for the build backend), installed with --require-hashes and
# --no-deps, so a build resolves nothing and any changed or unexpected file fails the build.
# Regenerate the locks with `make lock` after changing pyproject.toml; tests/unit/project/test_image_recipe.py
# checks that this file, the locks and pyproject.toml agree. For a bit-for-bit base, pin the base
# image by digest: --build-arg BASE_IMAGE=python:3.11-slim@sha256:<digest>.
#
# The final stage's virtualenv holds exactly the locked packages and licensectl: the pip and setuptools
# that `python -m venv` seeds are removed (they are unlocked), and the build fails if anything else
# is installed. It has no build files: it runs as uid/gid 65532 (non-root, no home directory) and works with a read-only root filesystem. It writes
# nothing but logs to stdout; Python's bytecode cache is disabled, and the Deployment mounts an
# emptyDir at /tmp for the temporary files of the Python runtime.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock requirements-build.lock ./
# The build backend (setuptools, wheel) in its own virtualenv: it never reaches the final image.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps -r requirements-build.lock
# The runtime dependencies, exactly as locked.
RUN python -m venv /opt/licensectl \
 && /opt/licensectl/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md LICENSE ./
COPY licensectl ./licensectl
# licensectl itself: built offline with the locked backend, installed without resolving anything.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --no-index --wheel-dir /wheels . \
 && /opt/licensectl/bin/pip install --no-deps --no-index /wheels/licensectl-*.whl \
 && /opt/licensectl/bin/pip check \
 && /opt/licensectl/bin/licensectl --version \
 && /opt/licensectl/bin/python -m pip uninstall -y setuptools pip \
 && /opt/licensectl/bin/python -c 'import importlib.metadata as m, re, sys; \
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower(); \
locked = {norm(ln.split("==")[0]) for ln in open("requirements.lock") if "==" in ln and not ln.startswith("#")}; \
extra = sorted({norm(d.metadata["Name"]) for d in m.distributions()} - locked - {"licensectl"}); \
sys.exit("unlocked packages in the image: " + ", ".join(extra) if extra else 0)' 

FROM ${BASE_IMAGE}
# HOME: kubernetes-asyncio resolves ~/.kube/config at import time, and uid 65532 has no passwd
# entry; /tmp is the Deployment's writable emptyDir.
ENV PATH=/opt/licensectl/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/licensectl /opt/licensectl
USER 65532:65532
# metrics: /metrics, /healthz, /readyz; reports: POST /v1/reports from guests; webhook: the
# apiserver's admission calls (the chart's and manifests' containerPorts; tests/chart checks them).
EXPOSE 8080 8443 9443
ENTRYPOINT ["licensectl"]
CMD ["run"]
