"""One line for every way a CLI command can fail to talk to the cluster (docs/operations.md#cli-exit-codes).

`licensectl status`, `rollout *` and `keys rotate` share it through main.py's dispatch, so a missing
kubeconfig, an unreachable API server, a refused permission or a missing object reads the same
everywhere and never as a traceback (that only with `--debug`). Messages name the problem and the
next step; they never carry a credential or an object's content.
"""

from __future__ import annotations

import aiohttp

from licensectl.kube.api import ApiException
from licensectl.kube.errors import Forbidden, NotFound, Unauthorized
from licensectl.kube.kubeconfig import KubeconfigError


class CliError(Exception):
    """A refusal or failure a command has already put into words (printed as is, exit 1)."""


def describe(e: BaseException, where: str | None = None) -> str:
    """The one-line message for `e`; `where` names the API server when known."""
    server = f" at {where}" if where else ""
    if isinstance(e, CliError):
        return str(e)
    if isinstance(e, KubeconfigError) or type(e).__name__ == "ConfigException":
        return (f"no usable kubeconfig: {e}; pass --kubeconfig, set KUBECONFIG, or run inside a cluster")
    if isinstance(e, ApiException):
        return api_error(e)
    if isinstance(e, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return f"TLS with the API server{server} failed ({type(e).__name__}); check the kubeconfig's CA and server"
    if isinstance(e, aiohttp.ClientConnectorError):
        why = e.os_error.strerror or type(e.os_error).__name__
        return (f"cannot reach the API server at {e.host}:{e.port} ({why}); "
                "is the kubeconfig's server right and the cluster up?")
    if isinstance(e, TimeoutError):
        return f"the API server{server} did not answer in time"
    if isinstance(e, aiohttp.ClientError | OSError):
        return f"cannot reach the API server{server} ({type(e).__name__}: {e})"
    return f"{type(e).__name__}: {e} (run with --debug for the traceback)"


def api_error(e: ApiException, what: str = "") -> str:
    """An API answer as words: forbidden and not found say what to check."""
    obj = f" {what}" if what else ""
    if isinstance(e, Unauthorized):
        return "unauthorized (HTTP 401): the API server refused the kubeconfig's credentials"
    if isinstance(e, Forbidden):
        return (f"forbidden (HTTP 403){obj}: the kubeconfig's user lacks a permission this command needs "
                "(docs/operations.md#permissions)")
    if isinstance(e, NotFound):
        return f"not found (HTTP 404){obj}"
    if e.status == 0:
        return f"the request{obj} could not be made ({e.reason or 'no answer'})"
    return f"HTTP {e.status} {e.reason}{obj} from the API server".strip()
