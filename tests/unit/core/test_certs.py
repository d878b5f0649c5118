"""The serving CA and leaf: what they contain and when a leaf must be renewed."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from licensectl.core import certs

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOSTS = ("licensectl-webhook.ns.svc", "licensectl-reports.ns.svc", "127.0.0.1")


@pytest.fixture(scope="module")
def ca() -> certs.KeyPair:
    return certs.new_ca(now=NOW)


@pytest.fixture(scope="module")
def leaf(ca: certs.KeyPair) -> certs.KeyPair:
    return certs.new_leaf(ca, HOSTS, now=NOW)


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_ca_is_a_ten_year_p256_ca_that_signs_only_leaves(ca: certs.KeyPair) -> None:
    c = _cert(ca.cert_pem)
    bc = c.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc.ca and bc.path_length == 0
    assert c.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert isinstance(c.public_key(), ec.EllipticCurvePublicKey)
    assert c.public_key().curve.name == "secp256r1"
    assert c.not_valid_after_utc - NOW == certs.CA_LIFETIME
    assert c.subject == c.issuer
    assert b"PRIVATE KEY" in ca.key_pem
    assert "PRIVATE" not in repr(ca) and "key_pem" not in repr(ca)


def test_leaf_names_every_host_and_is_for_serving_only(ca: certs.KeyPair, leaf: certs.KeyPair) -> None:
    c = _cert(leaf.cert_pem)
    san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"licensectl-webhook.ns.svc", "licensectl-reports.ns.svc"}
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert list(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]
    assert not c.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert c.issuer == _cert(ca.cert_pem).subject
    assert c.not_valid_after_utc - NOW == certs.LEAF_LIFETIME
    assert certs.signed_by(leaf.cert_pem, ca.cert_pem)
    assert certs.key_matches(leaf)
    assert certs.cert_hosts(c) == frozenset(HOSTS)


def test_leaf_never_outlives_its_ca() -> None:
    short_ca = certs.new_ca(now=NOW, lifetime=dt.timedelta(days=30))
    leaf = certs.new_leaf(short_ca, ["a"], now=NOW)
    assert certs.not_after(leaf.cert_pem) == certs.not_after(short_ca.cert_pem)


def test_two_leaves_differ_in_serial_and_key(ca: certs.KeyPair) -> None:
    a, b = certs.new_leaf(ca, ["a"], now=NOW), certs.new_leaf(ca, ["a"], now=NOW)
    assert certs.serial_of(a.cert_pem) != certs.serial_of(b.cert_pem)
    assert a.key_pem != b.key_pem
    assert not certs.key_matches(certs.KeyPair(cert_pem=a.cert_pem, key_pem=b.key_pem))


def test_leaf_needs_at_least_one_host(ca: certs.KeyPair) -> None:
    with pytest.raises(ValueError, match="at least one host"):
        certs.new_leaf(ca, [" ", ""], now=NOW)


def test_naive_time_is_refused(ca: certs.KeyPair, leaf: certs.KeyPair) -> None:
    naive = dt.datetime(2026, 1, 1)
    with pytest.raises(ValueError, match="timezone-aware"):
        certs.new_ca(now=naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        certs.needs_renewal(leaf.cert_pem, HOSTS, naive)


@pytest.mark.parametrize(("elapsed_days", "expected"), [
    (0, False), (200, False), (243, False), (244, True), (364, True), (365, True), (400, True)])
def test_renewal_once_a_third_of_the_lifetime_is_left(leaf: certs.KeyPair, elapsed_days: int,
                                                      expected: bool) -> None:
    # 365 days + 5 minutes backdating: a third left is reached after ~243.3 days.
    assert certs.needs_renewal(leaf.cert_pem, HOSTS, NOW + dt.timedelta(days=elapsed_days)) is expected


def test_renewal_when_a_host_is_not_covered(leaf: certs.KeyPair) -> None:
    assert certs.needs_renewal(leaf.cert_pem, (*HOSTS, "10.0.0.1"), NOW)
    assert certs.needs_renewal(leaf.cert_pem, ("other.svc",), NOW)
    # A subset, case and a trailing dot do not matter.
    assert not certs.needs_renewal(leaf.cert_pem, ("LICENSECTL-WEBHOOK.ns.svc.", "127.0.0.1"), NOW)


@pytest.mark.parametrize("pem", [b"", b"garbage", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_unparsable_certificate_needs_renewal(pem: bytes) -> None:
    assert certs.needs_renewal(pem, HOSTS, NOW)
    assert certs.not_after(pem) is None
    assert certs.serial_of(pem) is None
    assert not certs.signed_by(pem, pem)


def test_certificate_from_the_future_needs_renewal(ca: certs.KeyPair) -> None:
    future = certs.new_leaf(ca, HOSTS, now=NOW + dt.timedelta(days=10))
    assert certs.needs_renewal(future.cert_pem, HOSTS, NOW)
    assert not certs.needs_renewal(future.cert_pem, HOSTS, NOW + dt.timedelta(days=10))


def test_signed_by_rejects_another_ca(leaf: certs.KeyPair) -> None:
    other = certs.new_ca(now=NOW)
    assert not certs.signed_by(leaf.cert_pem, other.cert_pem)


def test_key_matches_rejects_garbage_key(leaf: certs.KeyPair) -> None:
    assert not certs.key_matches(certs.KeyPair(cert_pem=leaf.cert_pem, key_pem=b"nope"))
    assert not certs.key_matches(certs.KeyPair(cert_pem=b"nope", key_pem=leaf.key_pem))


def test_cert_without_san_covers_nothing(ca: certs.KeyPair) -> None:
    assert certs.cert_hosts(_cert(ca.cert_pem)) == frozenset()
    assert certs.needs_renewal(ca.cert_pem, ["a"], NOW)


@pytest.mark.parametrize(("raw", "hosts"), [
    ("", ()), (" , ,", ()), ("127.0.0.1", ("127.0.0.1",)),
    ("a.example, 127.0.0.1,A.example.,[::1]", ("a.example", "127.0.0.1", "::1")),
    ("::0001", ("::1",)),
])
def test_parse_hosts(raw: str, hosts: tuple[str, ...]) -> None:
    assert certs.parse_hosts(raw) == hosts


def test_python_ssl_accepts_the_pair_and_verifies_against_the_ca(tmp_path: object, ca: certs.KeyPair,
                                                                  leaf: certs.KeyPair) -> None:
    import pathlib
    d = pathlib.Path(str(tmp_path))
    (d / "tls.crt").write_bytes(leaf.cert_pem)
    (d / "tls.key").write_bytes(leaf.key_pem)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(d / "tls.crt", d / "tls.key")
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    assert client.cert_store_stats()["x509_ca"] == 1


def test_ca_is_renewed_only_when_unusable_or_in_its_last_leaf_lifetime(ca: certs.KeyPair,
                                                                       leaf: certs.KeyPair) -> None:
    assert not certs.needs_renewal_ca(ca.cert_pem, NOW)
    assert not certs.needs_renewal_ca(ca.cert_pem, NOW + certs.CA_LIFETIME - certs.LEAF_LIFETIME)
    assert certs.needs_renewal_ca(ca.cert_pem, NOW + certs.CA_LIFETIME - certs.LEAF_LIFETIME
                                  + dt.timedelta(seconds=1))
    assert certs.needs_renewal_ca(leaf.cert_pem, NOW)  # not a CA
    assert certs.needs_renewal_ca(b"garbage", NOW)
