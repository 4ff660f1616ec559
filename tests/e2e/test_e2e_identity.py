"""Who is calling, end to end: a MUNGE cluster (a real munged with its own key), real system
users made with ``useradd`` running the real ``xce`` command, a worker running jobs as their
submitters. Needs root, munged and useradd (fails naming them otherwise).

Users: ``alice`` and ``bob`` (plain users), ``carol`` (``[controller] admins``), ``dave`` (a
``[cluster] service_users`` user, no administrator: it runs the ``healthcheck`` role, granted
``hostctrl``). Root runs the daemons.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from xcecore import wire
from xcecore.testing.cluster import LocalCluster, wait_for
from xcecore.testing.munge import Munged, TestUsers, User, shared_dir, user_argv

pytestmark = pytest.mark.timeout(240)
GRANTED = "healthcheck"


@dataclass
class Site:
    """The running MUNGE cluster and its users."""

    root: Path
    munged: Munged
    cluster: LocalCluster
    alice: User
    bob: User
    carol: User
    dave: User

    def xce(self, user: User | None, *args: str, env: dict[str, str] | None = None,
            config: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``xce ARGS`` as ``user`` (None: root), with a clean environment plus ``env``."""
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root),
                "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        if user is not None:
            base.update({"LOGNAME": user.name, "USER": user.name})
        ids: dict[str, Any] = {}
        if user is not None:
            ids = {"user": user.uid, "group": user.gid, "extra_groups": []}
        argv = ["--config", str(config or self.cluster.config_path), "--timeout", "10", *args]
        return subprocess.run(
            user_argv(module="xcecore", args=tuple(argv)) if user else [sys.executable, "-m", "xcecore", *argv],
            capture_output=True, text=True, env={**base, **(env or {})}, cwd=self.root,
            timeout=60, check=False, **ids)

    def ok(self, user: User | None, *args: str) -> str:
        done = self.xce(user, *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def controller_log(self) -> str:
        return "".join(p.text() for p in self.cluster.candidates.values())


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    root = shared_dir("xce-identity-")
    users = TestUsers()
    munged = Munged(root / "munge")
    cluster: LocalCluster | None = None
    try:
        alice, bob, carol, dave = users.add("a"), users.add("b"), users.add("c"), users.add("d")
        for u in (alice, bob, carol, dave):  # a directory each user's jobs may write
            (root / u.name).mkdir()
            os.chown(root / u.name, u.uid, u.gid)
        munged.start()
        cluster = LocalCluster(
            root / "cluster", 2, None, auth="munge", munge_socket=munged.socket,
            cluster_extra=f'service_users = ["{dave.name}"]\n',
            extra_config=(f'[controller]\nadmins = ["{carol.name}"]\n'
                          f'grants = {{ {GRANTED} = ["hostctrl"] }}\n'))
        cluster.start()
        cluster.start_role("worker", 'worker.hname="n1"', f'worker.state_dir="{root / "w1"}"',
                           "worker.run_as_user=true", "worker.slots=4",
                           "worker.keep_jobs_on_shutdown=false", name="w1")
        cluster.start_role("scheduler", name="sched")
        s = Site(root, munged, cluster, alice, bob, carol, dave)
        wait_for(lambda: '"n1"' in s.xce(None, "hosts", "--json").stdout, 30, what="host n1")
        yield s
    finally:
        if cluster is not None:
            for proc in cluster.procs:
                if proc.name == "w1":
                    proc.stop()  # SIGTERM: it kills its jobs (keep_jobs_on_shutdown = false)
            cluster.close()
        munged.stop()
        errors = users.remove()
        shutil.rmtree(root, ignore_errors=True)
        assert not errors, errors


def submit(site: Site, user: User, command: str) -> int:
    out = site.ok(user, "submit", "--json", "--cwd", str(site.root / user.name), "--", "sh", "-c",
                  command)
    return int(json.loads(out)["jobid"])


def job(site: Site, jobid: int) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(site.ok(None, "jobs", "--json", str(jobid)))
    return found[0]


def done(site: Site, jobid: int) -> dict[str, Any] | None:
    rec = job(site, jobid)
    return rec if rec["state"] in ("DONE", "EXIT") else None


def test_a_job_runs_as_its_authenticated_submitter(site: Site) -> None:
    jobid = submit(site, site.alice, f"id -u > {site.root / site.alice.name / 'uid'}")
    rec = wait_for(lambda: done(site, jobid), 60, what=f"job {jobid} finished")
    assert rec["state"] == "DONE", rec
    assert (rec["user"], rec["uid"], rec["gid"], rec["via"]) == \
        (site.alice.name, site.alice.uid, site.alice.gid, None)
    assert (site.root / site.alice.name / "uid").read_text().strip() == str(site.alice.uid)
    # Her own jobs list shows it, named by the controller, not by $LOGNAME.
    mine = site.xce(site.alice, "jobs", "-a", "--json", env={"LOGNAME": "root", "USER": "root"})
    assert mine.returncode == 0, mine.stderr
    assert jobid in [j["jobid"] for j in json.loads(mine.stdout)]
    theirs = site.xce(site.bob, "jobs", "-a", "--json")
    assert jobid not in [j["jobid"] for j in json.loads(theirs.stdout)]


def test_a_claimed_login_name_changes_nothing(site: Site) -> None:
    for env in ({"LOGNAME": "root", "USER": "root"}, {"LOGNAME": site.carol.name, "USER": site.carol.name}):
        jobid = submit_env(site, site.bob, env, "true")
        rec = job(site, jobid)
        assert (rec["user"], rec["uid"]) == (site.bob.name, site.bob.uid), (env, rec)


def submit_env(site: Site, user: User, env: dict[str, str], command: str) -> int:
    out = site.xce(user, "submit", "--json", "--cwd", str(site.root / user.name), "--", command,
                   env=env)
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["jobid"])


ADMIN_COMMANDS = [
    ("queue", "close", "normal"),
    ("queue", "inactivate", "normal"),
    ("host", "close", "n1"),
    ("admin", "shutdown"),
]


@pytest.mark.parametrize("env", [{}, {"LOGNAME": "root", "USER": "root"}, "carol"])
@pytest.mark.parametrize("command", ADMIN_COMMANDS, ids=lambda c: " ".join(c))
def test_a_non_admin_is_refused_every_admin_op(site: Site, command: tuple[str, ...],
                                               env: dict[str, str] | str) -> None:
    if env == "carol":
        env = {"LOGNAME": site.carol.name, "USER": site.carol.name}
    assert isinstance(env, dict)
    got = site.xce(site.bob, *command, env=env)
    assert got.returncode != 0, got.stdout
    assert f"{site.bob.name} (uid {site.bob.uid}, cli@" in got.stderr
    assert "is not a cluster administrator (DENIED)" in got.stderr
    assert "refused: DENIED" in site.controller_log() and \
        f"{site.bob.name} (uid {site.bob.uid}) as cli@" in site.controller_log()
    status = site.xce(None, "queues", "--json")
    assert '"open": true' in status.stdout.replace('"open":true', '"open": true')


def test_force_run_is_an_admin_op(site: Site) -> None:
    jobid = submit(site, site.bob, "sleep 30")
    got = site.xce(site.bob, "run-job", str(jobid), "-m", "n1", env={"LOGNAME": "root"})
    assert got.returncode != 0 and "DENIED" in got.stderr, got.stderr
    site.ok(site.bob, "job", "kill", str(jobid))


def test_an_administrator_is_a_configured_user(site: Site) -> None:
    site.ok(site.carol, "queue", "close", "priority")
    try:
        rec = site.ok(None, "queues", "--json")
        assert '"priority"' in rec
    finally:
        site.ok(site.carol, "queue", "open", "priority")


def test_users_act_on_their_own_jobs_only(site: Site) -> None:
    jobid = submit(site, site.alice, "sleep 60")
    for env in ({}, {"LOGNAME": site.alice.name, "USER": site.alice.name}, {"LOGNAME": "root"}):
        got = site.xce(site.bob, "job", "kill", str(jobid), env=env)
        assert got.returncode != 0
        assert f"belongs to {site.alice.name}, not {site.bob.name}" in got.stderr, got.stderr
    assert job(site, jobid)["state"] in ("PEND", "RUN")
    assert f"jobctrl from {site.bob.name} (uid {site.bob.uid}) as cli@" in site.controller_log()
    site.ok(site.carol, "job", "kill", str(jobid))  # an administrator may
    wait_for(lambda: job(site, jobid)["state"] == "EXIT", 30, what="killed by the admin")


def test_users_revoke_their_own_tokens_only(site: Site) -> None:
    got = site.xce(site.bob, "admin", "revoke-tokens", site.alice.name,
                   env={"LOGNAME": site.alice.name, "USER": site.alice.name})
    assert got.returncode != 0
    assert f"may revoke only their own tokens, not {site.alice.name}'s" in got.stderr, got.stderr
    assert f"revoked every token of {site.bob.name}" in site.ok(site.bob, "admin", "revoke-tokens",
                                                                 site.bob.name)
    assert f"revoked every token of {site.alice.name}" in site.ok(site.carol, "admin",
                                                                   "revoke-tokens", site.alice.name)


# -- the wire: credentials a hostile client may offer -------------------------------------------


def raw_handshake(site: Site, answer_for: Any, index: int | None = None) -> dict[str, Any]:
    """Open a connection to the primary, answer its hello with ``answer_for(hello)``."""
    idx = site.cluster.wait_primary() if index is None else index
    with socket.create_connection(("127.0.0.1", site.cluster.ports[idx]), timeout=10) as s:
        dec = wire.FrameDecoder()

        def read() -> dict[str, Any]:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed by the controller")
                for msg in dec.feed(chunk):
                    return dict(msg)

        hello = read()
        s.sendall(wire.encode(answer_for(hello)))
        return read()


def as_user(user: User, code: str) -> str:
    """Run Python ``code`` as ``user`` (its munged credential is that user's); its stdout."""
    done = subprocess.run(user_argv(code=code), capture_output=True, text=True,
                          user=user.uid, group=user.gid, extra_groups=[], timeout=30, check=False,
                          env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_daemon_role_needs_a_service_identity(site: Site) -> None:
    """bob claims to be the API server (which may name users), a worker and the granted
    role: all refused at the handshake, by the credential's uid."""
    for role in ("apiserver", "worker", "scheduler", GRANTED):
        code = (
            "import json, socket, sys\n"
            "from xcecore import wire, auth\n"
            "from xcecore.auth.munge import MungeAuth\n"
            f"m = MungeAuth({site.munged.socket!r})\n"
            f"s = socket.create_connection(('127.0.0.1', {site.cluster.ports[site.cluster.wait_primary()]}))\n"
            "d = wire.FrameDecoder()\n"
            "def read():\n"
            "    while True:\n"
            "        for msg in d.feed(s.recv(65536)):\n"
            "            return msg\n"
            "hello = read()\n"
            f"s.sendall(wire.encode(auth.client_answer(m, '{role}@evil', hello)))\n"
            "print(json.dumps(read()))\n")
        reply = json.loads(as_user(site.bob, code))
        assert reply["ok"] is False and reply["error"]["code"] == "AUTH", reply
        assert reply["error"]["reason"] == "role" and f"{site.bob.name} (uid {site.bob.uid})" in \
            reply["error"]["message"], reply
    assert f"claiming '{GRANTED}@evil') refused" in site.controller_log() or \
        f"claiming {GRANTED}@evil) refused" in site.controller_log()


def test_forged_replayed_and_foreign_credentials_are_refused(site: Site, tmp_path: Path) -> None:
    from xcecore.auth.key import compute_mac
    from xcecore.auth.munge import Libmunge, payload_for

    lib = Libmunge(site.munged.socket)
    kept: dict[str, Any] = {}

    def good(hello: dict[str, Any]) -> dict[str, Any]:
        err, cred = lib.encode(payload_for(hello["challenge"], "cli@t"))
        assert err == 0
        kept["answer"] = {"from": "cli@t", "auth": "munge", "cred": cred}
        return kept["answer"]

    assert raw_handshake(site, good)["ok"] is True
    replayed = raw_handshake(site, lambda hello: kept["answer"])
    assert replayed["error"]["reason"] == "replayed", replayed

    def forged(hello: dict[str, Any]) -> dict[str, Any]:
        answer = good(hello)
        body = answer["cred"]
        return {**answer, "cred": body[:50] + ("A" if body[50] != "A" else "B") + body[51:]}

    assert raw_handshake(site, forged)["error"]["reason"] in ("malformed", "invalid")

    def other_uid(hello: dict[str, Any]) -> dict[str, Any]:
        _err, cred = lib.encode(payload_for(hello["challenge"], "cli@t"), uid_restriction=site.bob.uid)
        return {"from": "cli@t", "auth": "munge", "cred": cred}

    assert raw_handshake(site, other_uid)["error"]["reason"] == "unauthorized"

    def with_the_old_key(hello: dict[str, Any]) -> dict[str, Any]:
        return {"from": "worker@t", "auth": "key",
                "mac": compute_mac(b"xce-test-key", hello["challenge"], "worker@t")}

    assert raw_handshake(site, with_the_old_key)["error"]["reason"] == "wrong_method"

    def expired(hello: dict[str, Any]) -> dict[str, Any]:
        _err, cred = lib.encode(payload_for(hello["challenge"], "cli@t"), ttl=1)
        made = time.time()
        while time.time() < made + 2.2:  # expiry is time itself: past the 1 s lifetime
            time.sleep(0.1)
        return {"from": "cli@t", "auth": "munge", "cred": cred}

    got = raw_handshake(site, expired)
    assert got["error"]["reason"] == "expired" and "credential expired" in got["error"]["message"]
    with Munged(tmp_path / "other") as foreign:
        other = Libmunge(foreign.socket)

        def from_another_cluster(hello: dict[str, Any]) -> dict[str, Any]:
            _err, cred = other.encode(payload_for(hello["challenge"], "cli@t"))
            return {"from": "cli@t", "auth": "munge", "cred": cred}

        got = raw_handshake(site, from_another_cluster)
        assert got["error"]["reason"] == "invalid" and "another munge key" in got["error"]["message"]
    log = site.controller_log()
    for reason in ("replayed", "forged", "credential expired", "restricted to another uid",
                   "authenticates with 'munge'", "another munge key"):
        assert reason in log, reason


def test_the_cli_says_what_is_wrong_once_and_fast(site: Site) -> None:
    bad = site.root / "bad.toml"
    bad.write_text(site.cluster.config_path.read_text().replace(site.munged.socket,
                                                                str(site.root / "nowhere")))
    bad.chmod(0o644)
    got = site.xce(site.alice, "jobs", config=bad)
    assert got.returncode != 0
    assert got.stderr.count("Error: authentication failed") == 1, got.stderr
    assert got.stderr.count("refused the handshake") == 1 and "not retrying" in got.stderr
    assert "cannot get a MUNGE credential" in got.stderr and "is munged running" in got.stderr
    assert "no primary" not in got.stderr
    # A key in a MUNGE cluster's config is refused before anything is sent.
    keyed = site.root / "keyed.toml"
    keyed.write_text(site.cluster.config_path.read_text().replace('auth = "munge"',
                                                                  'auth = "munge"\nkey = "x"'))
    keyed.chmod(0o644)
    got = site.xce(site.alice, "jobs", config=keyed)
    assert got.returncode != 0 and "only auth = 'key' uses a shared key" in got.stderr, got.stderr


def test_a_granted_role_can_close_a_host_and_another_cannot(site: Site) -> None:
    """dave (a service user, no administrator) closes a host as the granted role; as another
    role, or as cli, he cannot; bob may not even claim the granted role."""
    def hostctrl(user: User, role: str, action: str) -> dict[str, Any]:
        code = (
            "import json\n"
            "from xcecore.client import SyncClient\n"
            "from xcecore.runtime import client_config, load\n"
            "from xcecore.wire import RemoteError\n"
            f"_, cfg = load({str(site.cluster.config_path)!r})\n"
            "try:\n"
            f"    with SyncClient.open(client_config(cfg, '{role}@probe'), role={role!r}) as c:\n"
            f"        print(json.dumps(c.call('hostctrl', {{'host': 'n1', 'action': {action!r}, "
            "'comment': 'sick'}, deadline=10)))\n"
            "except RemoteError as exc:\n"
            "    print(json.dumps({'error': exc.code, 'message': exc.message}))\n"
            "except Exception as exc:\n"
            "    print(json.dumps({'error': type(exc).__name__, 'message': str(exc)}))\n")
        return dict(json.loads(as_user(user, code)))

    for role in ("otherprobe", "cli"):
        got = hostctrl(site.dave, role, "close")
        assert got.get("error") == "DENIED" and "is not a cluster administrator" in got["message"], got
    got = hostctrl(site.dave, GRANTED, "close")
    assert got["closed"] is True and got["comment"] == "sick", got
    got = hostctrl(site.dave, GRANTED, "open")
    assert got["closed"] is False, got
    got = hostctrl(site.bob, GRANTED, "close")
    assert got["error"] == "AuthenticationFailed" and "a role holding grants" in got["message"], got


def test_a_front_end_acts_for_the_user_it_names(site: Site) -> None:
    """The API server's identity (root here, a service user) names the user; the controller
    applies that user's rights and records both; the job runs as the named user."""
    from xcecore.client import SyncClient
    from xcecore.runtime import client_config, load
    from xcecore.wire import RemoteError

    _, cfg = load(site.cluster.config_path)
    out = site.root / site.alice.name / "via-uid"
    with SyncClient.open(client_config(cfg, "apiserver@web1"), role="apiserver") as front:
        jobid = front.call("jobsubmit", {"command": f"id -u > {out}", "user": site.alice.name,
                                         "cwd": str(site.root / site.alice.name)}, deadline=10)["jobid"]
        rec = wait_for(lambda: done(site, jobid), 60, what=f"job {jobid} submitted via the front end")
        assert rec["state"] == "DONE", rec
        assert (rec["user"], rec["uid"], rec["via"]) == (site.alice.name, None, "apiserver@web1")
        assert out.read_text().strip() == str(site.alice.uid)
        with pytest.raises(RemoteError) as err:  # a front end must name the user
            front.call("queuectrl", {"queue": "normal", "action": "close"}, deadline=10)
        assert err.value.code == "INVALID" and "must name the user it acts for" in err.value.message
        with pytest.raises(RemoteError) as err:  # the named user's rights, not the front end's
            front.call("queuectrl", {"queue": "normal", "action": "close", "user": site.bob.name},
                       deadline=10)
        assert err.value.code == "DENIED" and f"{site.bob.name} via apiserver@web1" in err.value.message
        for action in ("close", "open"):
            front.call("queuectrl", {"queue": "normal", "action": action, "user": site.carol.name},
                       deadline=10)
        # A job a front end submits for root never runs as root: the worker fails it, saying so.
        rootjob = front.call("jobsubmit", {"command": "true", "user": "root", "cwd": str(site.root)},
                             deadline=10)["jobid"]
        rec = wait_for(lambda: done(site, rootjob), 60, what="the front end's job for root ended")
        assert rec["state"] == "EXIT" and "never runs as root" in rec["reason"], rec
    # Anyone else naming a user is refused, root included (only a front end names users).
    with SyncClient.open(client_config(cfg, "cli@h"), role="cli") as cli:
        with pytest.raises(RemoteError) as err:
            cli.call("jobsubmit", {"command": "true", "user": site.alice.name}, deadline=10)
        assert err.value.code == "DENIED" and "only a front end names a user" in err.value.message
    assert "via apiserver@web1" in site.controller_log()
