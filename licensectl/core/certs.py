"""Serving certificates for the HTTPS listeners: a private CA and the leaf it signs. Pure (no I/O).

Used by the self-managed TLS mode (docs/operations.md#serving-tls): licensectl keeps its own CA and
serving certificate in a Secret; every replica serves the same leaf, and the leader renews it well
before it expires. Time is always passed in, so renewal decisions are testable.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = dt.timedelta(days=3650)
LEAF_LIFETIME = dt.timedelta(days=365)
# Renew once less than this fraction of the lifetime is left (cert-manager's default, 2/3 elapsed).
RENEW_FRACTION = 1 / 3
# Tolerate clocks of other replicas (and the apiserver's) being slightly behind.
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8) private key; the key never appears in repr."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)


def _aware(now: dt.datetime) -> dt.datetime:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def parse_hosts(raw: str) -> tuple[str, ...]:
    """Comma-separated hosts (a flag value) -> normalized, de-duplicated, order kept."""
    out: list[str] = []
    for part in raw.split(","):
        h = _normalize_host(part)
        if h and h not in out:
            out.append(h)
    return tuple(out)


def _normalize_host(host: str) -> str:
    h = host.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        return h.lower().rstrip(".")


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        n = _normalize_host(h)
        if not n:
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            names.append(x509.DNSName(n))
    if not names:
        raise ValueError("a serving certificate needs at least one host")
    return x509.SubjectAlternativeName(names)


def new_ca(*, now: dt.datetime, common_name: str = "licensectl serving CA",
           lifetime: dt.timedelta = CA_LIFETIME) -> KeyPair:
    """A new self-signed EC P-256 CA that may only sign leaf certificates (pathlen 0)."""
    now = _aware(now)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def new_leaf(ca: KeyPair, hosts: Iterable[str], *, now: dt.datetime,
             lifetime: dt.timedelta = LEAF_LIFETIME) -> KeyPair:
    """A serving certificate for `hosts` (DNS names and IPs) signed by `ca`; never outlives the CA."""
    now = _aware(now)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC key")
    san = _san(hosts)
    key = ec.generate_private_key(ec.SECP256R1())
    first = san[0].value
    cn = str(first)[:64]
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(san, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def load_cert(cert_pem: bytes) -> x509.Certificate | None:
    """The first certificate of a PEM blob, or None when it is not one."""
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except (ValueError, TypeError):
        return None


def not_after(cert_pem: bytes) -> dt.datetime | None:
    """Expiry (UTC) of the first certificate in `cert_pem`, or None when unparsable."""
    cert = load_cert(cert_pem)
    return None if cert is None else cert.not_valid_after_utc


def serial_of(cert_pem: bytes) -> int | None:
    cert = load_cert(cert_pem)
    return None if cert is None else cert.serial_number


def cert_hosts(cert: x509.Certificate) -> frozenset[str]:
    """Normalized DNS names and IPs of a certificate's SAN extension (empty when it has none)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    dns = san.get_values_for_type(x509.DNSName)
    ips = san.get_values_for_type(x509.IPAddress)
    return frozenset([_normalize_host(d) for d in dns] + [str(ip) for ip in ips])


def needs_renewal(cert_pem: bytes, hosts: Iterable[str], now: dt.datetime) -> bool:
    """True when the leaf is unparsable, does not name every host, or has under 1/3 of its life left."""
    now = _aware(now)
    cert = load_cert(cert_pem)
    if cert is None:
        return True
    wanted = {n for n in (_normalize_host(h) for h in hosts) if n}
    if not wanted <= cert_hosts(cert):
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start - BACKDATE:
        return True  # issued in the future: someone's clock is wrong, a fresh one is safer
    return end - now < (end - start) * RENEW_FRACTION


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """True when `cert_pem` was issued by the CA in `ca_pem` (signature checked)."""
    cert, ca = load_cert(cert_pem), load_cert(ca_pem)
    if cert is None or ca is None:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(pair: KeyPair) -> bool:
    """True when the private key belongs to the certificate (a torn write would fail the TLS load)."""
    cert = load_cert(pair.cert_pem)
    try:
        key = serialization.load_pem_private_key(pair.key_pem, password=None)
    except (ValueError, TypeError):
        return False
    if cert is None:
        return False
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(cert.public_key().public_bytes(serialization.Encoding.PEM, pub)
                == key.public_key().public_bytes(serialization.Encoding.PEM, pub))


def needs_renewal_ca(ca_pem: bytes, now: dt.datetime) -> bool:
    """True when the CA is unparsable, not a CA, or has less than one leaf lifetime left.

    A CA change makes every client re-learn the bundle (guests at their next boot), so it is
    renewed only this late; leaves are renewed under the same CA long before.
    """
    now = _aware(now)
    cert = load_cert(ca_pem)
    if cert is None:
        return True
    try:
        if not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            return True
    except x509.ExtensionNotFound:
        return True
    return cert.not_valid_after_utc - now < LEAF_LIFETIME
