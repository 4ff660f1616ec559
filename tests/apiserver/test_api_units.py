"""Store, auth, hooks and config of the API server, without a controller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apikit import load as sync_into
from click.testing import CliRunner
from xce_apiserver import plugin
from xce_apiserver.auth import (
    AuthConfigError,
    Authenticator,
    hash_password,
    parse_users,
    verify_password,
)
from xce_apiserver.store import Store

from xcecore.candidates import CandidateError
from xcecore.config import ConfigError
from xcecore.protocol import parse_hostport
from xcecore.role import ALL_PUSHES
from xcecore.runtime import client_config, load

pytestmark = pytest.mark.timeout(60)


def _state(**kw: Any) -> dict[str, Any]:
    base = {"cluster": {"name": "c", "resources": []},
            "queues": [{"name": "normal", "priority": 30, "open": True}],
            "hosts": [{"name": "n1", "state": "ok", "max_slots": 2, "used_slots": 0, "attrs": {}, "resvals": {}}],
            "jobs": [{"jobid": 1, "user": "a", "state": "PEND"}],
            "members": [{"identity": "scheduler@x", "role": "scheduler"}]}
    return {**base, **kw}


def _ids(s: Store) -> list[int]:
    return [j["jobid"] for j in s.page_jobs(limit=1000).jobs]


# ---------------------------------------------------------------------- store

def test_a_snapshot_replaces_everything() -> None:
    s = Store()
    assert not s.ready
    sync_into(s, _state())
    s.apply("job", {"jobid": 2, "user": "b", "state": "PEND"})
    assert s.ready and _ids(s) == [1, 2]
    sync_into(s, _state(jobs=[{"jobid": 7, "user": "c", "state": "RUN"}], hosts=[]))
    assert _ids(s) == [7] and s.hosts == {}


def test_deltas() -> None:
    s = Store()
    sync_into(s, _state())
    hv = s.hosts_version
    s.apply("resvals", {"host": "n1", "values": {"r1m": 1.5}})
    assert s.hosts["n1"]["resvals"] == {"r1m": 1.5} and s.hosts_version == hv + 1
    s.apply("host", {"name": "n2", "state": "ok", "max_slots": 1, "used_slots": 0})
    assert list(s.hosts) == ["n1", "n2"]
    s.apply("queue", {"name": "hi", "priority": 50, "open": True})
    assert [q["name"] for q in s.snapshot_queues()] == ["hi", "normal"]
    s.apply("jusage", {"jobid": 1, "usage": {"mem": 5}})
    s.apply("pend_reasons", {"reasons": {"1": "no hosts", "99": "x"}})
    s.apply("job", {"jobid": 1, "user": "a", "state": "PEND", "signal": "stop"})
    job = s.get_job(1)
    assert job is not None and job["usage"] == {"mem": 5} and job["pend_reason"] == "no hosts"
    assert job["signal"] == "stop"
    s.apply("member", {"identity": "worker@n1", "role": "worker", "joined": True})
    s.apply("member", {"identity": "scheduler@x", "role": "scheduler", "joined": False})
    assert list(s.members) == ["worker@n1"]
    assert s.apply("shutdown", {"server": "a:1"}) is False
    assert s.apply("mystery", {}) is False


def test_a_malformed_push_changes_nothing() -> None:
    s = Store()
    sync_into(s, _state())
    before = (_ids(s), dict(s.hosts), s.version)
    s.apply("sync_records", {"kind": "jobs", "items": [{"nojobid": 1}]})
    s.apply("job", {"user": "x"})
    s.apply("host", {"state": "ok"})
    assert (_ids(s), dict(s.hosts), s.version) == before


# ---------------------------------------------------------------------- auth

def test_hash_and_verify() -> None:
    h = hash_password("s3cret", iterations=1000)
    assert h.startswith("pbkdf2_sha256$1000$")
    assert verify_password("s3cret", h) and not verify_password("s3cret ", h)
    assert hash_password("a", iterations=1000) != hash_password("a", iterations=1000)  # salted


@pytest.mark.parametrize(
    ("entry", "needle"),
    [({"name": "a", "password_hash": "md5$x", "role": "user"}, "pbkdf2_sha256"),
     ({"name": "a", "password_hash": "pbkdf2_sha256$x$a$b", "role": "user"}, "malformed"),
     ({"name": "", "password_hash": "p", "role": "user"}, "'name'"),
     ({"name": "a", "password_hash": None}, "password_hash"),
     ({"name": "a", "password_hash": hash_password("x", iterations=1000), "role": "root"}, "'role'"),
     ({"name": "a", "pw": "x"}, "unknown key"),
     ("alice", "expected a table")],
)
def test_bad_users_are_named(entry: Any, needle: str) -> None:
    with pytest.raises(AuthConfigError, match="apiserver.users\\[0\\]") as info:
        parse_users([entry])
    assert needle in str(info.value)


def test_duplicate_user() -> None:
    e = {"name": "a", "password_hash": hash_password("x", iterations=1000)}
    with pytest.raises(AuthConfigError, match="twice"):
        parse_users([e, e])


def test_tokens_expire_and_revoke() -> None:
    now = [0.0]
    users = parse_users([{"name": "a", "password_hash": hash_password("pw", iterations=1000), "role": "admin"}])
    auth = Authenticator(users, token_ttl=10, clock=lambda: now[0])
    user = auth.check_password("a", "pw")
    assert user is not None and user.is_admin
    assert auth.check_password("a", "no") is None and auth.check_password("zz", "pw") is None
    s1, s2 = auth.issue(user), auth.issue(user)
    assert s1.token != s2.token and auth.lookup(s1.token) == s1
    # A revocation record (what the controller commits) refuses that token only, naming why.
    auth.revocations.hold({"key": f"t:{s1.jti}", "user": "a", "jti": s1.jti, "expires": 10.0,
                           "at": 0.0, "rev": 1})
    why = auth.check(s1.token)
    assert auth.lookup(s1.token) is None and isinstance(why, str) and "revoked" in why
    assert auth.lookup(s2.token) == s2
    now[0] = 10.5
    assert auth.check(s2.token) == "token expired"


def test_hash_password_command() -> None:
    import click

    group = click.Group("xce")
    plugin.xce_cli_commands(group)
    result = CliRunner().invoke(group, ["apiserver", "hash-password", "--password-stdin",
                                        "--iterations", "1000"], input="hunter2\n")
    assert result.exit_code == 0, result.output
    assert verify_password("hunter2", result.output.strip())
    result = CliRunner().invoke(group, ["apiserver", "hash-password", "--iterations", "1000"],
                                input="pw\npw\n")
    assert result.exit_code == 0 and verify_password("pw", result.output.strip().splitlines()[-1])


# ---------------------------------------------------------------------- hooks

def test_the_role_object(xce_plugin_manager: Any, xce_role: Any) -> None:
    pm = xce_plugin_manager(plugin)
    (spec,) = plugin.xce_roles()
    assert spec.name == "apiserver" and spec.client
    role = xce_role(pm, "apiserver", {"apiserver": {"listen": "127.0.0.1:9999"}})
    assert role.rejoin_points == {"jobsubmit", "jobctrl", "queuectrl", "hostctrl", "jobdispatch",
                                  "revoke_token"}
    assert role.join_attributes() == {"listen": "127.0.0.1:9999"}
    assert pm.join_attributes("apiserver", role.ctx.config) == {"listen": "127.0.0.1:9999"}


def test_pushes_feed_the_role_store(xce_plugin_manager: Any, xce_role: Any) -> None:
    role = xce_role(xce_plugin_manager(plugin), "apiserver")
    assert role.subscription.to_wire() == ALL_PUSHES.to_wire()
    seq = iter(range(1, 100))
    sync_into(type("Feed", (), {"apply": lambda self, e, d: role.push(e, next(seq), d)})(), _state())
    assert role.push("job", 2, {"jobid": 5, "user": "u", "state": "PEND"}) is None
    assert _ids(role.store) == [1, 5]


def test_connection_states_drive_the_breaker(xce_plugin_manager: Any, xce_role: Any) -> None:
    role = xce_role(xce_plugin_manager(plugin), "apiserver", {"apiserver": {"failover_grace": 0}})
    health = role.health
    assert health.grace == 0
    role.connection_state("reconnecting", None, "closed by the controller")
    v = health.verdict(False)
    assert v.open and "reconnecting: closed by the controller" in v.reason
    role.connection_state("degraded", None, "budget exhausted")  # the same outage
    assert "closed by the controller" in health.verdict(False).reason
    role.connection_state("rejoined", None, "heartbeats recovered")
    health.grace = 60.0
    assert health.verdict(False).state == "grace"  # closed by the re-join; a new loss starts over
    role.connection_state("connected", None, "reconnected by heartbeat")
    assert health.verdict(True).state == "closed"


@pytest.mark.parametrize(
    ("listen", "ok"),
    [("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:8080", ("::1", 8080)), ("h:65536", None),
     ("h", None), ("::1:80", None), (":80", None), ("h:x", None)],
)
def test_listen(listen: str, ok: tuple[str, int] | None) -> None:
    if ok is None:
        with pytest.raises(ValueError, match="apiserver.listen"):
            parse_hostport(listen, what="apiserver.listen", port_zero=True)
    else:
        assert parse_hostport(listen, what="apiserver.listen", port_zero=True) == ok


def test_config_section_validates(tmp_path: Path) -> None:
    cfg = tmp_path / "x.toml"
    cfg.write_text('[cluster]\npeers = "127.0.0.1:7600"\n[apiserver]\nlisten = "nope"\n')
    with pytest.raises(ConfigError, match="apiserver.listen"):
        load(cfg)
    cfg.write_text('[cluster]\npeers = "127.0.0.1:7600"\n[apiserver]\nusers = [{name = "a"}]\n')
    with pytest.raises(ConfigError, match="password_hash"):
        load(cfg)
    cfg.write_text('[cluster]\npeers = "127.0.0.1:7600"\n[apiserver]\nfailover_grace = -1\n')
    with pytest.raises(ConfigError, match="failover_grace"):
        load(cfg)
    cfg.write_text('[cluster]\npeers = "127.0.0.1:7600"\n[apiserver]\nmax_body = 10\n')
    with pytest.raises(ConfigError, match="max_body"):
        load(cfg)


# ---------------------------------------------------------------------- candidate parity

MALFORMED_PEERS = [
    "", " ", "h1", "h1:", "h1:x", "h1:0", "h1:70000", ":7600", "h1:7600,", ",h1:7600",
    "h1:7600,,h2:7600", "::1:7600", "[::1:7600", "::1]:7600", "[]:7600", "[h1]:7600",
    "[::1]7600", "h 1:7600", "h1..x:7600", "h1:7600,h1:7600", "-h:7600",
]


def _reject(tmp_path: Path, role: str, peers: str) -> str | None:
    cfg = tmp_path / f"{role}.toml"
    cfg.write_text("[cluster]\nkey = \"k\"\n")
    try:
        _, config = load(cfg, [f'cluster.peers="{peers}"'])
        client_config(config, f"{role}@test")
    except (CandidateError, ConfigError) as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("peers", MALFORMED_PEERS)
def test_candidate_list_parity(tmp_path: Path, peers: str) -> None:
    """apiserver, worker and scheduler reject exactly the same malformed peers, the same way."""
    answers = {role: _reject(tmp_path, role, peers) for role in ("apiserver", "worker", "scheduler")}
    assert answers["apiserver"] is not None, f"apiserver accepted {peers!r}"
    assert answers["apiserver"] == answers["worker"] == answers["scheduler"], answers


def test_candidate_list_parity_accepts_the_same(tmp_path: Path) -> None:
    for peers in ("127.0.0.1:7600", "127.0.0.1:1,127.0.0.1:2,[::1]:3"):
        assert {_reject(tmp_path, r, peers) for r in ("apiserver", "worker", "scheduler")} == {None}


def test_job_removed_drops_purged_jobs() -> None:
    s = Store()
    sync_into(s, _state(jobs=[{"jobid": 1, "user": "a", "state": "DONE"},
                              {"jobid": 2, "user": "a", "state": "EXIT"},
                              {"jobid": 3, "user": "a", "state": "PEND"}]))
    v = s.version
    s.apply("job_removed", {"jobids": [1, 2, 99]})  # an unknown id is no error
    assert _ids(s) == [3] and s.get_job(1) is None and s.version == v + 2
    s.apply("job_removed", {"nope": []})  # malformed: logged and ignored
    assert _ids(s) == [3]
