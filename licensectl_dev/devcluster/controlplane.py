"""A real kube-apiserver + etcd + kube-controller-manager on loopback, built from Go modules.

Integration tests and the demo run against the genuine control plane (the envtest approach), not a
fake: admission, RBAC, watches, status subresources, garbage collection and namespace finalization
behave exactly as in a cluster. Binaries are built once from the pinned wrapper modules in go/
and cached per version, so a fresh clone needs only a Go toolchain and the module proxy.

Optionally a kube-scheduler too (`ControlPlane(scheduler=True)`), for a control plane that plays a
workload cluster with Nodes and scheduled Pods (see tenant_cluster.py). It is built lazily into its own
cache directory, so a binary cache made before the scheduler existed stays valid.

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import structlog
import yaml

log = structlog.get_logger(__name__)

# ---------------------------------------------------------------------------------------------
# Pinned versions. The Go wrapper modules in go/ pin the same versions; change both together.
# ---------------------------------------------------------------------------------------------
K8S_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
GO_DIR = Path(__file__).resolve().parent / "go"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")

LOOPBACK = "127.0.0.1"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "licensectl-admin"
ADMIN_GROUP = "system:masters"
SCHEDULER = "kube-scheduler"
# Only what a deleted Namespace and ownerReference garbage collection need.
KCM_CONTROLLERS = ("namespace-controller", "garbage-collector-controller")
# A workload ("tenant") cluster: Deployments, PodDisruptionBudgets and the `default` ServiceAccount
# pods need. Names are the v1.30+ `--controllers` names (cmd/kube-controller-manager/names). No
# node-lifecycle-controller: the node agent simulator (tenant_nodes.py) plays node status instead.
TENANT_KCM_CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
    "serviceaccount-controller",
)

HEARTBEAT_SECONDS = 15.0

Logger = Callable[[str], None]


def _stderr(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


class BuildError(RuntimeError):
    """The Go toolchain is missing or `go build` failed; carries the command and its stderr tail."""


class ControlPlaneError(RuntimeError):
    """A control-plane process failed to start or become ready; carries the tail of its log."""


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------
def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """`$LICENSECTL_CACHE_DIR`, else `$XDG_CACHE_HOME/licensectl`, else `~/.cache/licensectl`."""
    e = os.environ if env is None else env
    if e.get("LICENSECTL_CACHE_DIR"):
        return Path(e["LICENSECTL_CACHE_DIR"]).expanduser()
    xdg = e.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path(e.get("HOME") or Path.home()) / ".cache"
    return base / "licensectl"


def binaries_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the built binaries of the pinned versions live."""
    return (
        cache_root(env) / "controlplane" / f"k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}" / "bin"
    )


def scheduler_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where kube-scheduler of the pinned version lives: beside `binaries_dir`, not in it, so the main
    cache stays valid without it and a rebuild of either never removes the other."""
    return binaries_dir(env).parent / "scheduler-bin"


def _kube_ldflags() -> str:
    """The -X flags stamp the real version, so `/version` answers v1.35.4 like a released binary."""
    minor = K8S_VERSION.split(".")[1]
    return " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={K8S_VERSION}",
            "-X k8s.io/component-base/version.gitMajor=1",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
            f"-X k8s.io/client-go/pkg/version.gitVersion={K8S_VERSION}",
        ]
    )


def scheduler_build_command(out_dir: Path) -> tuple[Path, list[str]]:
    """The `go build` (working dir, argv) for kube-scheduler, from the same pinned module as kube-apiserver."""
    return (
        GO_DIR / "kube",
        ["go", "build", "-v", "-trimpath", "-ldflags", _kube_ldflags(), "-o", str(out_dir) + os.sep,
         f"k8s.io/kubernetes/cmd/{SCHEDULER}"],
    )


def build_commands(out_dir: Path) -> list[tuple[Path, list[str]]]:
    """The `go build` invocations (working dir, argv) that produce every binary in `out_dir`."""
    ldflags = _kube_ldflags()
    return [
        (
            GO_DIR / "etcd",
            ["go", "build", "-v", "-trimpath", "-o", str(out_dir / "etcd"), "go.etcd.io/etcd/server/v3"],
        ),
        (
            GO_DIR / "kube",
            [
                "go", "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(out_dir) + os.sep,
                "k8s.io/kubernetes/cmd/kube-apiserver",
                "k8s.io/kubernetes/cmd/kube-controller-manager",
                "k8s.io/kubernetes/cmd/kubectl",
            ],
        ),
    ]


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (bound and released; loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def render_kubeconfig(
    server: str,
    ca_pem: bytes | str | None,
    *,
    token: str | None = None,
    client_cert_pem: bytes | str | None = None,
    client_key_pem: bytes | str | None = None,
    name: str = "licensectl-dev",
    user: str = "admin",
    namespace: str | None = None,
) -> str:
    """A single-context kubeconfig for `server` with either a bearer token or a client certificate."""
    if token is None and (client_cert_pem is None or client_key_pem is None):
        raise ValueError("a token or a client certificate + key is required")

    def b64(v: bytes | str) -> str:
        return base64.b64encode(v.encode() if isinstance(v, str) else v).decode()

    cluster: dict[str, Any] = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = b64(ca_pem)
    creds: dict[str, Any] = {}
    if token is not None:
        creds["token"] = token
    if client_cert_pem is not None and client_key_pem is not None:
        creds["client-certificate-data"] = b64(client_cert_pem)
        creds["client-key-data"] = b64(client_key_pem)
    ctx: dict[str, Any] = {"cluster": name, "user": user}
    if namespace:
        ctx["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": name, "context": ctx}],
        "current-context": name,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("r", errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# Building the binaries
# ---------------------------------------------------------------------------------------------
def _have_binaries(d: Path) -> bool:
    return all(os.access(d / b, os.X_OK) for b in BINARIES)


def run_go_build(argv: list[str], *, cwd: Path, log_fn: Logger, env: Mapping[str, str],
                 prefix: str = "control plane") -> None:
    """Run one `go build -v`, with a heartbeat (elapsed, packages done, last package).

    Shared by the control plane and the Go tools (gotools.py): a cold build takes minutes on two
    cores, so the heartbeat shows it is alive; a failure raises BuildError with the stderr tail.
    """
    pkgs = [a for a in argv if "/" in a and not a.startswith(("-", os.sep))]
    label = ", ".join(p.rsplit("/", 1)[-1] if p.startswith("k8s.io") else p for p in pkgs)
    log_fn(f"{prefix}: building {label} (cwd {cwd.name}): {' '.join(argv[:2])} ...")
    start = time.monotonic()
    tail: deque[str] = deque(maxlen=60)
    count = 0
    last = ""
    lock = threading.Lock()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_SECONDS):
            with lock:
                n, pkg = count, last
            log_fn(
                f"{prefix}: still building ({time.monotonic() - start:.0f}s elapsed, "
                f"{n} packages compiled, last: {pkg})"
            )

    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(env)
    )
    hb = threading.Thread(target=beat, daemon=True)
    hb.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip("\n")
            with lock:
                tail.append(line)
                count += 1
                last = line
        rc = proc.wait()
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        raise BuildError(
            f"`{' '.join(argv)}` (in {cwd}) failed with exit code {rc}; stderr tail:\n" + "\n".join(tail)
        )
    log_fn(f"{prefix}: built {label} in {time.monotonic() - start:.1f}s")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`: one builder per cache entry across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def built_into(dest: Path, *, prefix: str) -> Iterator[Path]:
    """Yield a fresh sibling directory of `dest` to build into; when the block succeeds it replaces
    `dest` in one rename (so no reader ever sees half a build), and it is removed when the block fails.
    Call under `file_lock`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{prefix}.tmp-", dir=dest.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp makes it 0700; helm reads a tool dir as a plugin dir
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_binaries(log: Logger = _stderr, env: Mapping[str, str] | None = None) -> Path:
    """Return the directory holding etcd, kube-apiserver, kube-controller-manager and kubectl.

    Builds them on a cache miss: into a temporary sibling directory that is renamed into place,
    under a file lock, so concurrent callers never see (or both build) a half-written cache.
    """
    e = dict(os.environ if env is None else env)
    bin_dir = binaries_dir(e)
    if _have_binaries(bin_dir):
        log(f"control plane: cache hit {bin_dir}")
        return bin_dir
    with file_lock(bin_dir.parent / ".build.lock"):
        if _have_binaries(bin_dir):  # another process built it while we waited
            log(f"control plane: cache hit {bin_dir}")
            return bin_dir
        if shutil.which("go", path=e.get("PATH")) is None:
            raise BuildError(
                "the Go toolchain (`go`) is not on PATH; it is needed once to build "
                f"kube-apiserver {K8S_VERSION} and etcd {ETCD_VERSION} into {bin_dir}"
            )
        log(f"control plane: cache miss, building Kubernetes {K8S_VERSION} and etcd {ETCD_VERSION} "
            f"into {bin_dir} (first time only; several minutes on 2 cores)")
        started = time.monotonic()
        with built_into(bin_dir, prefix="bin") as tmp:
            for cwd, argv in build_commands(tmp):
                run_go_build(argv, cwd=cwd, log_fn=log, env=e)
            if not _have_binaries(tmp):
                raise BuildError(f"go build finished but {tmp} lacks one of {', '.join(BINARIES)}")
        log(f"control plane: build done in {time.monotonic() - started:.0f}s -> {bin_dir}")
    return bin_dir


def ensure_scheduler(log: Logger = _stderr, env: Mapping[str, str] | None = None) -> Path:
    """Return the directory holding kube-scheduler, building it on a cache miss.

    Separate from `ensure_binaries` (own directory, lock and completion check): only control planes
    with `scheduler=True` need it, and older caches without it stay valid for everyone else.
    """
    e = dict(os.environ if env is None else env)
    sched_dir = scheduler_dir(e)

    def have(d: Path) -> bool:
        return os.access(d / SCHEDULER, os.X_OK)

    if have(sched_dir):
        log(f"control plane: cache hit {sched_dir}")
        return sched_dir
    with file_lock(sched_dir.parent / ".scheduler-build.lock"):
        if have(sched_dir):
            log(f"control plane: cache hit {sched_dir}")
            return sched_dir
        if shutil.which("go", path=e.get("PATH")) is None:
            raise BuildError(
                f"the Go toolchain (`go`) is not on PATH; it is needed once to build {SCHEDULER} "
                f"{K8S_VERSION} into {sched_dir}"
            )
        log(f"control plane: cache miss, building {SCHEDULER} {K8S_VERSION} into {sched_dir} "
            "(first time only; minutes on 2 cores, less when kube-apiserver was built before)")
        started = time.monotonic()
        with built_into(sched_dir, prefix="scheduler-bin") as tmp:
            cwd, argv = scheduler_build_command(tmp)
            run_go_build(argv, cwd=cwd, log_fn=log, env=e)
            if not have(tmp):
                raise BuildError(f"go build finished but {tmp} lacks {SCHEDULER}")
        log(f"control plane: {SCHEDULER} build done in {time.monotonic() - started:.0f}s -> {sched_dir}")
    return sched_dir


# ---------------------------------------------------------------------------------------------
# Certificates and keys (openssl CLI: present on every dev machine and CI image; no new deps)
# ---------------------------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ControlPlaneError(f"openssl {args[0]} failed: {r.stderr.strip()[-2000:]}")


def _issue_cert(cert_dir: Path, name: str, cn: str, sans: Sequence[str], usage: str) -> None:
    """A leaf certificate `name`.crt/.key signed by ca.crt, with the extensions strict TLS needs."""
    ext = cert_dir / f"{name}.ext"
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
        "subjectKeyIdentifier=hash",
        "authorityKeyIdentifier=keyid,issuer",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=cert_dir)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "365", "-sha256", "-extfile", ext.name,
             "-out", f"{name}.crt", cwd=cert_dir)


def generate_pki(cert_dir: Path) -> None:
    """CA, apiserver and controller-manager serving certs, and the service-account RSA key pair."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-sha256", "-subj", "/CN=licensectl-devcluster-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=cert_dir)
    sans = ["IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local", "IP:10.0.0.1"]
    _issue_cert(cert_dir, "apiserver", "kube-apiserver", sans, "serverAuth")
    _issue_cert(cert_dir, "kcm", "kube-controller-manager", ["IP:127.0.0.1", "DNS:localhost"],
                "serverAuth")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=cert_dir)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=cert_dir)
    for p in cert_dir.iterdir():
        if p.suffix == ".key":
            p.chmod(0o600)


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1

# How long a restart lets kube-apiserver or etcd exit on SIGTERM before SIGKILL. Both stop listening at
# once, then hold their clients' open watch streams until those end, which they never do on their own:
# kube-apiserver until the full stop timeout (10 s), etcd for 7 s. Either way the clients see a refused
# listener and then cut connections; a short wait only makes the restart come sooner. The data is safe:
# etcd's writes are in the page cache, which survives the process.
RESTART_STOP_SECONDS = 2.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM the child if the test process dies abruptly (no orphaned apiservers)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Proc:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = self.log_path.open("ab")
        # PDEATHSIG is tied to the creating *thread*; only arm it from the main thread, whose exit
        # really means the process is going away.
        pre = _die_with_parent if threading.current_thread() is threading.main_thread() else None
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us; we shut the components down in order
            preexec_fn=pre,
        )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; always reaped."""
        p = self.popen
        if p is not None:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
                    p.wait()
            self.popen = None
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler) on 127.0.0.1, in a temp dir.

    Sync API so pytest fixtures, the demo and the CLI can all use it. The admin credential is a
    static token for a user in `system:masters`; it is kept out of repr and logs.

    `scheduler=True` also runs kube-scheduler; `kcm_controllers` overrides KCM_CONTROLLERS (a workload
    cluster passes TENANT_KCM_CONTROLLERS). `name` only labels log lines and the temp dir.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        log: Logger = _stderr,
        start_timeout: float = 90.0,
        work_dir: Path | None = None,
        scheduler: bool = False,
        kcm_controllers: Sequence[str] | None = None,
        scheduler_dir: Path | None = None,
        name: str = "control plane",
    ) -> None:
        self._bin_dir = bin_dir
        self.scheduler = scheduler
        self.kcm_controllers: tuple[str, ...] = tuple(kcm_controllers or KCM_CONTROLLERS)
        self._scheduler_dir = scheduler_dir
        self.name = name
        self.scheduler_port = 0
        self._log = log
        self._start_timeout = start_timeout
        self._given_work_dir = work_dir
        self.work_dir: Path | None = None
        self._procs: dict[str, _Proc] = {}
        self._token = ""
        self.etcd_client_port = 0
        self.etcd_peer_port = 0
        self.apiserver_port = 0
        self.kcm_port = 0
        self.version = ""
        self.startup_seconds = 0.0

    def __repr__(self) -> str:
        return f"ControlPlane(server={self.server!r}, version={self.version!r}, pids={self.pids})"

    # -- paths and credentials -------------------------------------------------------------
    def _wd(self) -> Path:
        if self.work_dir is None:
            raise ControlPlaneError("control plane is not started")
        return self.work_dir

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            raise ControlPlaneError("binaries not resolved yet; call start()")
        return self._bin_dir

    @property
    def scheduler_path(self) -> Path:
        """kube-scheduler: from `scheduler_dir`, else beside the other binaries, else the scheduler cache."""
        if self._scheduler_dir is not None:
            return self._scheduler_dir / SCHEDULER
        return self.bin_dir / SCHEDULER

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.apiserver_port}" if self.apiserver_port else ""

    @property
    def cert_dir(self) -> Path:
        return self._wd() / "pki"

    @property
    def ca_path(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def ca_pem(self) -> bytes:
        return self.ca_path.read_bytes()

    @property
    def admin_token(self) -> str:
        """The admin bearer token (system:masters). Never log it."""
        return self._token

    @property
    def kubeconfig_path(self) -> Path:
        return self._wd() / "kubeconfig"

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def etcd_url(self) -> str:
        return f"http://{LOOPBACK}:{self.etcd_client_port}"

    @property
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self._procs.items() if p.pid is not None and p.alive()}

    def log_path(self, component: str) -> Path:
        return self._wd() / "logs" / f"{component}.log"

    def log_tail(self, component: str, lines: int = 40) -> str:
        return _tail(self.log_path(component), lines)

    def issue_serving_cert(self, name: str) -> tuple[Path, Path]:
        """(cert, key) for a loopback HTTPS server trusted through this cluster's CA (e.g. a proxy).

        Go clients (kubectl, client-go) do not send bearer tokens over plain HTTP, so anything
        that fronts the apiserver with a kubeconfig must speak TLS."""
        cert, key = self.cert_dir / f"{name}.crt", self.cert_dir / f"{name}.key"
        if not cert.exists():
            _issue_cert(self.cert_dir, name, name, ["IP:127.0.0.1", "DNS:localhost"], "serverAuth")
            key.chmod(0o600)
        return cert, key

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_path))

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries(log=self._log)
        if self.scheduler and self._scheduler_dir is None and not os.access(self.scheduler_path, os.X_OK):
            self._scheduler_dir = ensure_scheduler(log=self._log)
        self.work_dir = self._given_work_dir or Path(tempfile.mkdtemp(prefix="licensectl-cp-"))
        try:
            self._prepare()
            self._start_etcd()
            self._start_apiserver()
            self._start_kcm()
            if self.scheduler:
                self._start_scheduler()
            self.version = self._get_version()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        self._log(
            f"{self.name}: ready in {self.startup_seconds:.1f}s: kube-apiserver {self.version} at "
            f"{self.server}, kubeconfig {self.kubeconfig_path}"
        )
        log.info("control plane ready", name=self.name, server=self.server, version=self.version,
                 seconds=round(self.startup_seconds, 2), pids=self.pids)
        return self

    def stop(self) -> None:
        """Stop kube-scheduler, kube-controller-manager, kube-apiserver, etcd (in that order) and remove
        temp dirs."""
        for name in (SCHEDULER, "kube-controller-manager", "kube-apiserver", "etcd"):
            p = self._procs.get(name)
            if p is not None:
                p.stop()
        self._procs.clear()
        if self.work_dir is not None and self._given_work_dir is None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir = None
        self.apiserver_port = 0
        self.scheduler_port = 0

    def restart_apiserver(self) -> None:
        """Stop and start kube-apiserver on the same port with the same storage (fault tests)."""
        p = self._procs["kube-apiserver"]
        p.stop(RESTART_STOP_SECONDS)
        p.start()
        self._wait_apiserver_ready()

    def restart_etcd(self) -> None:
        """Stop and start etcd on the same ports with the same data dir (fault tests)."""
        p = self._procs["etcd"]
        p.stop(RESTART_STOP_SECONDS)
        p.start()
        self._wait_etcd_healthy()
        self._wait_apiserver_ready()

    # -- internals -------------------------------------------------------------------------
    def _prepare(self) -> None:
        wd = self._wd()
        wd.mkdir(parents=True, exist_ok=True)
        generate_pki(self.cert_dir)
        self._token = secrets.token_urlsafe(32)
        tokens = self.cert_dir / "tokens.csv"
        tokens.write_text(f'{self._token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n')
        tokens.chmod(0o600)
        ports: set[int] = set()
        while len(ports) < 5:
            ports.add(free_port())
        (self.etcd_client_port, self.etcd_peer_port, self.apiserver_port, self.kcm_port,
         self.scheduler_port) = sorted(ports)
        if self.scheduler:
            _issue_cert(self.cert_dir, "scheduler", SCHEDULER, ["IP:127.0.0.1", "DNS:localhost"], "serverAuth")
            (self.cert_dir / "scheduler.key").chmod(0o600)
        ca = self.ca_pem
        kc = render_kubeconfig(self.server, ca, token=self._token)
        self.kubeconfig_path.write_text(kc)
        self.kubeconfig_path.chmod(0o600)

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        p = _Proc(name=name, argv=argv, log_path=self.log_path(name))
        self._procs[name] = p
        p.start()
        return p

    def _wait(self, name: str, probe: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self._start_timeout
        proc = self._procs[name]
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ControlPlaneError(
                    f"{name} exited before {what}; log tail ({self.log_path(name)}):\n{self.log_tail(name)}"
                )
            if probe():
                return
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{name} not {what} after {self._start_timeout:.0f}s; log tail:\n{self.log_tail(name)}"
        )

    def _http_ok(self, url: str, *, tls: bool, token: bool) -> bool:
        req = urllib.request.Request(url)  # noqa: S310 - fixed loopback URLs built above
        if token:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(  # noqa: S310
                req, timeout=2, context=self.ssl_context() if tls else None
            ) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _start_etcd(self) -> None:
        peer = f"http://{LOOPBACK}:{self.etcd_peer_port}"
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={self._wd() / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync=true",  # test data; as envtest does
            "--log-level=warn",
        ])
        self._wait_etcd_healthy()

    def _wait_etcd_healthy(self) -> None:
        def probe() -> bool:
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:  # noqa: S310
                    return bool(json.loads(r.read()).get("health") == "true")
            except (urllib.error.URLError, OSError, ValueError):
                return False

        self._wait("etcd", probe, "healthy")

    def _start_apiserver(self) -> None:
        c = self.cert_dir
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={c}",
            f"--tls-cert-file={c / 'apiserver.crt'}",
            f"--tls-private-key-file={c / 'apiserver.key'}",
            f"--client-ca-file={c / 'ca.crt'}",
            f"--token-auth-file={c / 'tokens.csv'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={c / 'sa.pub'}",
            f"--service-account-signing-key-file={c / 'sa.key'}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # A loopback advertise address cannot be written into the `kubernetes` Endpoints.
            "--endpoint-reconciler-type=none",
        ])
        self._wait_apiserver_ready()

    def _wait_apiserver_ready(self) -> None:
        self._wait("kube-apiserver", lambda: self._http_ok(f"{self.server}/readyz", tls=True, token=True),
                   "ready (/readyz)")

    def _start_kcm(self) -> None:
        kc = self._wd() / "kcm.kubeconfig"
        kc.write_text(render_kubeconfig(self.server, self.ca_pem, token=self._token, user=ADMIN_USER))
        kc.chmod(0o600)
        c = self.cert_dir
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--controllers={','.join(self.kcm_controllers)}",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.kcm_port}",
            f"--cert-dir={self._wd() / 'kcm-certs'}",
            f"--tls-cert-file={c / 'kcm.crt'}",
            f"--tls-private-key-file={c / 'kcm.key'}",
        ])
        self._wait(
            "kube-controller-manager",
            lambda: self._http_ok(f"https://{LOOPBACK}:{self.kcm_port}/healthz", tls=True, token=False),
            "healthy (/healthz)",
        )

    def _start_scheduler(self) -> None:
        """kube-scheduler with the admin credential, no leader election, serving /healthz on loopback."""
        kc = self._wd() / "scheduler.kubeconfig"
        kc.write_text(render_kubeconfig(self.server, self.ca_pem, token=self._token, user=ADMIN_USER))
        kc.chmod(0o600)
        c = self.cert_dir
        self._spawn(SCHEDULER, [
            str(self.scheduler_path),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.scheduler_port}",
            f"--cert-dir={self._wd() / 'scheduler-certs'}",
            f"--tls-cert-file={c / 'scheduler.crt'}",
            f"--tls-private-key-file={c / 'scheduler.key'}",
        ])
        self._wait(
            SCHEDULER,
            lambda: self._http_ok(f"https://{LOOPBACK}:{self.scheduler_port}/healthz", tls=True, token=False),
            "healthy (/healthz)",
        )

    def _get_version(self) -> str:
        req = urllib.request.Request(f"{self.server}/version")  # noqa: S310
        req.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(req, timeout=5, context=self.ssl_context()) as r:  # noqa: S310
            return str(json.loads(r.read())["gitVersion"])
