"""Where the apiserver is and how to authenticate: a kubeconfig context, or the in-cluster service account.

Covers what a controller and its CLI meet in practice: server, CA (file or data), client certificate
and key (file or data), a bearer token (inline or a file re-read as it rotates), insecure-skip-tls-verify,
tls-server-name and proxy-url. Anything else (an `exec` or `auth-provider` user, several files in
$KUBECONFIG) returns None, and the caller falls back to kubernetes-asyncio's loader: the library is
imported only then (it costs ~38 MiB, see kube/api.py).
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The projected service-account token rotates; client-go and kubernetes-asyncio re-read it each minute.
TOKEN_REREAD_SECONDS = 60.0


class KubeconfigError(Exception):
    """The kubeconfig is missing, unreadable or names a context, cluster or user it does not define."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    ssl_context: ssl.SSLContext
    token: str | None = None
    token_file: str | None = None
    server_hostname: str | None = None
    proxy: str | None = None


class TokenSource:
    """Bearer token headers: a fixed token, or a file read again at most every `period` seconds."""

    def __init__(self, *, token: str | None, token_file: str | None, period: float = TOKEN_REREAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._token = token
        self._file = token_file
        self._period = period
        self._clock = clock
        self._read_at: float | None = None

    def _current(self) -> str | None:
        if self._file and (self._read_at is None or self._clock() - self._read_at >= self._period):
            try:
                self._token = Path(self._file).read_text().strip() or self._token
            except OSError:
                if self._token is None:
                    raise
            self._read_at = self._clock()
        return self._token

    async def headers(self) -> Mapping[str, str]:
        token = self._current()
        return {"Authorization": f"Bearer {token}"} if token else {}


def named_entry(items: Any, name: str, kind: str) -> dict[str, Any]:
    """The `kind` mapping of the entry named `name` in a kubeconfig list (contexts, clusters, users)."""
    if items is not None and not isinstance(items, list):
        raise KubeconfigError(f"kubeconfig's {kind}s are not a list")
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(kind), dict):
            return dict(item[kind])
    raise KubeconfigError(f"kubeconfig has no {kind} named {name!r}")


def _material(entry: Mapping[str, Any], key: str, base: Path) -> tuple[str | None, bytes | None]:
    """(file path, inline bytes) for `key` / `key-data`; relative paths resolve against the kubeconfig."""
    data = entry.get(f"{key}-data")
    if data:
        try:
            return None, base64.b64decode("".join(str(data).split()), validate=True)
        except ValueError as e:
            raise KubeconfigError(f"{key}-data is not base64") from e
    path = entry.get(key)
    if path:
        p = Path(str(path)).expanduser()
        return str(p if p.is_absolute() else base / p), None
    return None, None


def ssl_context(*, ca_file: str | None = None, ca_data: bytes | None = None, cert: tuple[str | None, bytes | None]
                = (None, None), key: tuple[str | None, bytes | None] = (None, None),
                insecure: bool = False) -> ssl.SSLContext:
    """A client TLS context. Inline key material goes through a private temporary file (the ssl module
    loads chains from files only), removed as soon as it is loaded."""
    ctx = ssl.create_default_context(cafile=ca_file, cadata=ca_data.decode() if ca_data else None)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert_file, cert_data = cert
    key_file, key_data = key
    if not (cert_file or cert_data):
        return ctx
    with contextlib.ExitStack() as stack:
        def spill(data: bytes) -> str:
            fd, name = tempfile.mkstemp(prefix="licensectl-", suffix=".pem")
            stack.callback(os.unlink, name)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return name

        certfile = cert_file or spill(cert_data or b"")
        keyfile = key_file or (spill(key_data) if key_data else None)
        ctx.load_cert_chain(certfile, keyfile=keyfile)
    return ctx


def endpoint_from_kubeconfig(path: str | None, context: str | None = None) -> Endpoint | None:
    """The endpoint of `context` (or the current context) in one kubeconfig file; None when the file
    needs kubernetes-asyncio's loader (exec / auth-provider users, several files in $KUBECONFIG)."""
    if path is None:
        env = os.environ.get("KUBECONFIG", "")
        if os.pathsep in env:
            return None
        path = env or str(Path("~/.kube/config").expanduser())
    file = Path(path).expanduser()
    try:
        doc = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise KubeconfigError(f"cannot read kubeconfig {file}: {type(e).__name__}") from e
    return endpoint_from_document(doc, context, base=file.parent, what=f"kubeconfig {file}")


def endpoint_from_document(doc: object, context: str | None = None, *, base: Path | None = None,
                           what: str = "kubeconfig") -> Endpoint | None:
    """The endpoint of a kubeconfig already parsed (a tenant cluster's, read from a Secret: its key
    material is inline, and a relative path in it resolves against nothing, so it is refused)."""
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{what} is not a mapping")
    name = context or doc.get("current-context")
    if not name:
        raise KubeconfigError(f"{what} has no current-context")
    ctx = named_entry(doc.get("contexts"), str(name), "context")
    cluster = named_entry(doc.get("clusters"), str(ctx.get("cluster")), "cluster")
    user = named_entry(doc.get("users"), str(ctx.get("user")), "user") if ctx.get("user") else {}
    if user.get("exec") or user.get("auth-provider") or user.get("username"):
        return None
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"cluster {ctx.get('cluster')!r} has no server")
    if base is None and any(e.get(k) for e, k in ((cluster, "certificate-authority"), (user, "client-certificate"),
                                                   (user, "client-key"), (user, "tokenFile"))):
        raise KubeconfigError(f"{what} refers to files; only inline (-data) key material can be used")
    base = base or Path()
    ca_file, ca_data = _material(cluster, "certificate-authority", base)
    token_file = user.get("tokenFile")
    if token_file and not Path(str(token_file)).is_absolute():
        token_file = str(base / str(token_file))
    return Endpoint(
        host=str(server),
        ssl_context=ssl_context(ca_file=ca_file, ca_data=ca_data,
                                cert=_material(user, "client-certificate", base),
                                key=_material(user, "client-key", base),
                                insecure=bool(cluster.get("insecure-skip-tls-verify"))),
        token=str(user["token"]) if user.get("token") else None,
        token_file=str(token_file) if token_file else None,
        server_hostname=cluster.get("tls-server-name") or None,
        proxy=cluster.get("proxy-url") or None,
    )


def in_cluster_endpoint(environ: Mapping[str, str] = os.environ, sa_dir: Path = SA_DIR) -> Endpoint:
    """The apiserver Service and the pod's projected service-account token and CA."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeconfigError("not running in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set")
    if ":" in host:
        host = f"[{host}]"
    token_file = sa_dir / "token"
    if not token_file.exists():
        raise KubeconfigError(f"service account token {token_file} not found")
    return Endpoint(host=f"https://{host}:{port}", ssl_context=ssl_context(ca_file=str(sa_dir / "ca.crt")),
                    token_file=str(token_file))
