"""The [etcd] section's checks, the backend key, and the client's pure helpers (no etcd needed)."""

from __future__ import annotations

import pytest
from xce_etcd.client import EtcdError, prefix_end
from xce_etcd.plugin import xce_controller_election, xce_controller_store
from xce_etcd.settings import SECTION, settings_from

from xcecore.config import CORE_SECTIONS, ConfigError, validate


def config(etcd: dict[str, object]):
    return validate({"etcd": etcd}, [*CORE_SECTIONS, SECTION])


@pytest.mark.parametrize(("bad", "text"), [
    ({"endpoints": []}, "non-empty list"),
    ({"endpoints": ["etcd1:2379"]}, "not an http"),
    ({"endpoints": ["http://a:2379"], "prefix": "xce"}, "must start with /"),
    ({"endpoints": ["http://a:2379"], "lease_ttl": 1.5}, "whole seconds"),
    ({"endpoints": ["http://a:2379"], "lease_ttl": 0}, "lease_ttl must be > 0"),
    ({"endpoints": ["http://a:2379"], "safety_margin": 0.6}, "safety_margin"),
    ({"endpoints": ["http://a:2379"], "max_txn_ops": 2}, "max_txn_ops"),
    ({"endpoints": ["http://a:2379"], "cert_file": "/c.pem"}, "go together"),
    ({"endpoints": ["http://a:2379"], "transport": "h2"}, "transport must be"),
])
def test_bad_sections_are_refused_naming_the_key(bad: dict[str, object], text: str) -> None:
    with pytest.raises(ConfigError, match=text):
        config(bad)


def test_settings_and_the_backend_selection() -> None:
    cfg = config({"endpoints": ["http://a:2379", "https://b:2379"], "lease_ttl": 2})
    s = settings_from(cfg.section("etcd"))
    assert s.endpoints == ("http://a:2379", "https://b:2379") and s.grant_ttl == 2 and s.prefix == "/xce"
    assert s.transport == "grpc"
    assert settings_from(config({"endpoints": ["http://a:2379"], "transport": "gateway"})
                         .section("etcd")).transport == "gateway"
    # other backends: the plugin answers nothing (the built-in file backend does)
    assert xce_controller_election(advertise="h:1", backend="file", config=cfg) is None
    assert xce_controller_store(backend="file", election=None) is None
    with pytest.raises(RuntimeError, match="needs the etcd election"):
        xce_controller_store(backend="etcd", election=object())
    with pytest.raises(ValueError, match="endpoints is required"):
        settings_from(config({}).section("etcd"))


def test_prefix_end_and_definite_errors() -> None:
    assert prefix_end(b"/xce/s/") == b"/xce/s0"
    assert prefix_end(b"a\xff") == b"b"
    assert EtcdError(8, "etcdserver: mvcc: database space exceeded").definite
    assert not EtcdError(14, "etcdserver: request timed out").definite
