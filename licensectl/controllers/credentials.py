"""The `core.ports.Credentials` the replication loop writes into replicas: one object, not five callbacks.

A replica carries what its guest needs to report: the credential of the signing key ring for its
namespace, the ring's current key id and revocation epoch, and the CA bundle the guest verifies the
reports listener with (none over plain HTTP). All are read at call time, so a key rotation or a new
serving certificate shows in the next pass (docs/design.md#key-ring).
"""

from __future__ import annotations

from collections.abc import Callable

from licensectl.kube.serving_tls import ServingTLS
from licensectl.kube.signing_key import SigningKeyStore


class KeyringCredentials:
    def __init__(self, keys: SigningKeyStore, tls: ServingTLS, *, plain_http: bool) -> None:
        self._keys = keys
        self._tls = tls
        self._plain_http = plain_http

    def credential_for(self, namespace: str) -> str:
        ring = self._keys.keyring
        return ring.credential(namespace) if ring is not None else ""

    def bound(self) -> Callable[[str], str]:
        """`credential_for` bound to the current key ring (a pass plans in another thread with it)."""
        ring = self._keys.keyring
        return ring.credential if ring is not None else (lambda _ns: "")

    def key_id(self) -> str:
        ring = self._keys.keyring
        return ring.current_id if ring is not None else ""

    def epoch(self) -> str:
        ring = self._keys.keyring
        return ring.revocation if ring is not None else ""

    def report_ca(self) -> bytes:
        """The CA bundle guests verify the reports listener with (none over plain HTTP)."""
        return b"" if self._plain_http else self._tls.ca_bundle
