"""A tenant cluster's kubeconfig Secret, read: every malformed field is a named hold (TenantUnreachable
naming the Secret and the field), every other input a client configuration that connects; nothing else
ever leaves the reader (docs/operations.md#tenant-cluster-workers-runbook)."""

from __future__ import annotations

import base64
import datetime as dt
import functools
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from licensectl.core.certs import new_ca
from licensectl.core.ports import TenantUnreachable
from licensectl.kube.tenant import tenant_endpoint

SECRET = "Secret t-a/k1-kubeconfig"


@functools.cache
def ca_b64() -> str:
    return base64.b64encode(new_ca(now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)).cert_pem).decode()


def kubeconfig(cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "k1",
            "contexts": [{"name": "k1", "context": {"cluster": "k1", "user": "k1-admin"}}],
            "clusters": [{"name": "k1", "cluster": {"server": "https://10.0.0.1:6443",
                                                    "certificate-authority-data": ca_b64(), **(cluster or {})}}],
            "users": [{"name": "k1-admin", "user": {"token": "abc.def", **(user or {})}}]}


def data(doc: object) -> dict[str, str]:
    return {"value": base64.b64encode(yaml.safe_dump(doc).encode()).decode()}


def test_a_good_kubeconfig_is_a_client_configuration() -> None:
    e = tenant_endpoint(data(kubeconfig({"tls-server-name": "api.k1", "proxy-url": "http://proxy:3128"})), SECRET)
    assert (e.host, e.server_hostname, e.proxy, e.token) == ("https://10.0.0.1:6443", "api.k1",
                                                              "http://proxy:3128", "abc.def")


@pytest.mark.parametrize(("secret_data", "field"), [
    ({}, "key 'value' is missing"),
    ({"other": "x"}, "key 'value' is missing"),
    (None, "key 'value' is missing"),
    ({"value": "%%%"}, "key 'value' is not base64"),
    ({"value": base64.b64encode(b"a: [b").decode()}, "key 'value' is not YAML"),
    (data(["a list"]), "is not a mapping"),
    (data(kubeconfig({"server": "https://10.0.0.1:99999"})), "server"),
    (data(kubeconfig({"server": "garbage"})), "server"),
    (data(kubeconfig({"server": "https://"})), "server has no host"),
    (data(kubeconfig({"server": "ftp://h:21"})), "server is not an https or http URL"),
    (data(kubeconfig({"server": "https://h:0"})), "server has a port not from 1 to 65535"),
    (data(kubeconfig({"server": ["https://h"]})), "server"),
    (data(kubeconfig({"tls-server-name": 7})), "tls-server-name is not a host name"),
    (data(kubeconfig({"tls-server-name": ["a"]})), "tls-server-name is not a host name"),
    (data(kubeconfig({"tls-server-name": "a b"})), "tls-server-name is not a host name"),
    (data(kubeconfig({"proxy-url": "garbage"})), "proxy-url"),
    (data(kubeconfig({"proxy-url": "socks5://p:1080"})), "proxy-url is not an http or https URL"),
    (data(kubeconfig({"proxy-url": 3128})), "proxy-url is not a URL"),
    (data(kubeconfig({"certificate-authority-data": "%%%"})), "certificate-authority-data is not base64"),
    (data(kubeconfig({"certificate-authority-data": base64.b64encode(b"not a cert").decode()})),
     "certificate-authority-data is not a PEM certificate"),
    (data(kubeconfig(user={"client-certificate-data": base64.b64encode(b"x").decode()})),
     "client-certificate-data / client-key-data cannot be loaded"),
    (data(kubeconfig(user={"token": "two words"})), "token is not a bearer token"),
    (data(kubeconfig(user={"exec": {"command": "x"}})), "user needs an exec or auth-provider plugin"),
])
def test_each_malformed_field_is_a_hold_naming_the_secret_and_the_field(secret_data: object, field: str) -> None:
    with pytest.raises(TenantUnreachable) as e:
        tenant_endpoint(secret_data, SECRET)
    assert str(e.value).startswith(SECRET + ": ") and field in str(e.value), str(e.value)
    assert "abc.def" not in str(e.value)  # never a credential


def _connectable(host: str) -> bool:
    url = URL(host)
    return url.scheme in ("http", "https") and bool(url.host) and url.port is not None and 1 <= url.port <= 65535


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=False),
                    st.text(max_size=40), st.sampled_from(["https://h:6443", "https://h:99999", "http://[::1]:1",
                                                           "garbage", "https://", ca_b64(), "k1", "k1-admin"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=3)),
                      max_leaves=8)
FIELDS = st.fixed_dictionaries({}, optional={
    "server": VALUES, "tls-server-name": VALUES, "proxy-url": VALUES, "certificate-authority-data": VALUES,
    "insecure-skip-tls-verify": VALUES, "certificate-authority": VALUES})
USER = st.fixed_dictionaries({}, optional={"token": VALUES, "client-certificate-data": VALUES,
                                           "client-key-data": VALUES, "exec": VALUES, "tokenFile": VALUES})


def _documents() -> st.SearchStrategy[object]:
    shaped = st.builds(lambda c, u: kubeconfig(c, u), FIELDS, USER)
    return st.one_of(shaped, VALUES, st.builds(lambda d, k, v: {**d, k: v}, shaped,
                                               st.sampled_from(["contexts", "clusters", "users", "current-context"]),
                                               VALUES))


@settings(max_examples=400, deadline=None)
@given(doc=_documents(), raw=st.one_of(st.none(), st.text(max_size=30), st.binary(max_size=30)))
def test_every_input_is_a_named_hold_or_a_client_configuration(doc: object, raw: object) -> None:
    secret_data: object = data(doc) if raw is None else {"value": raw if isinstance(raw, str)
                                                         else base64.b64encode(raw).decode()}
    try:
        e = tenant_endpoint(secret_data, SECRET)
    except TenantUnreachable as held:
        assert str(held).startswith(SECRET + ": ")
        assert "cannot be used (" not in str(held), str(held)  # a field named, not the last-resort catch
        return
    assert _connectable(e.host)
    assert e.server_hostname is None or isinstance(e.server_hostname, str)
    assert e.proxy is None or _connectable(e.proxy)
    assert e.token is None or (e.token.isascii() and e.token.isprintable() and " " not in e.token)
