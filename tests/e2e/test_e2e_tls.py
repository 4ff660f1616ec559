"""TLS on the wire, with real processes: a TLS cluster through a SIGKILL failover, and the
refusals (a wrong CA, an expired certificate) said clearly on both sides."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xcecore.client import SyncClient
from xcecore.runtime import client_config, load
from xcecore.testing import LocalCluster, wait_for
from xcecore.tlscerts import make_ca, make_host

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]

ADMIN = '[controller]\nadmins = ["root"]\nhost_timeout = 60.0\n'


def xce(config: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xcecore", "--config", str(config),
                           "--timeout", "5", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def other_config(cl: LocalCluster, path: Path, tls: str) -> Path:
    """A client config for ``cl``'s candidates with ``tls`` as its [tls] table."""
    path.write_text(f'[cluster]\npeers = "{cl.peers}"\nkey = "{cl.key}"\n'
                    "[client]\nconnect_timeout = 1.0\n" + tls)
    return path


def plain_hello(cl: LocalCluster, index: int) -> bytes:
    """What a candidate sends a plain TCP client in its first 0.3 s (a plain candidate sends
    its hello frame at once; a TLS one waits for the client's TLS hello)."""
    with socket.create_connection(("127.0.0.1", cl.ports[index]), timeout=2) as s:
        s.settimeout(0.3)
        try:
            return s.recv(100)
        except TimeoutError:
            return b""


def test_tls_cluster_end_to_end_through_a_sigkill_failover(
        xce_cluster: Callable[..., LocalCluster]) -> None:
    cl = xce_cluster(3, tls=True, require_client_cert=True, extra_config=ADMIN)
    assert plain_hello(cl, 0) == b"", "the primary answered a plain TCP client in clear text"
    worker = cl.start_role("worker", 'worker.hname="t1"', f'worker.state_dir="{cl.root / "w"}"',
                           "worker.hello_interval=0.2", name="worker")
    _, cfg = load(cl.config_path)
    with SyncClient.open(client_config(cfg, "cli@tls"), role="cli") as c:
        def done(jobid: int) -> bool:
            job = c.call("jobinfo", {"jobids": [jobid]})["jobs"][0]
            return bool(job["state"] == "DONE")

        def host_up() -> bool:
            return any(h["name"] == "t1" and h["available"]
                       for h in c.call("hostinfo", {})["hosts"])

        def run() -> int:
            jobid: int = c.call("jobsubmit", {"command": "true"})["jobid"]
            c.call("jobdispatch", {"jobid": jobid, "alloc": [{"host": "t1", "ntasks": 1}],
                                   "force": True})
            return jobid

        wait_for(host_up, 30, what="the worker joined over TLS")
        first = run()
        wait_for(lambda: done(first), 30, what="a job run over TLS")
        old, new = cl.kill_primary()  # SIGKILL
        assert old != new
        second = run()  # the client reconnects to the new primary, over TLS
        wait_for(host_up, 30, what="the worker re-joined the new primary over TLS")
        wait_for(lambda: done(second), 30, what="a job run after the failover")
    assert plain_hello(cl, new) == b""
    out = xce(cl.config_path, "jobs", "-a")  # the one-shot client, over TLS
    assert out.returncode == 0, out.stderr
    assert f"{first} " in out.stdout and f"{second} " in out.stdout, out.stdout
    assert worker.alive()
    assert "TLS handshake refused" not in cl.logs()


def test_wrong_ca_is_refused_with_a_clear_message_on_both_sides(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cl = xce_cluster(1, tls=True)
    other = tmp_path / "other-ca"
    make_ca(other, name="another CA")
    files = make_host(other, "client", ["127.0.0.1"])
    # A client that trusts another CA: it refuses the candidate's certificate.
    config = other_config(cl, tmp_path / "wrong-ca.toml", f'[tls]\nca = "{other / "ca.pem"}"\n')
    out = xce(config, "status")
    assert out.returncode != 0
    assert f"controller {cl.address(0)}'s certificate is not signed by the CA in tls.ca " \
           f"({other / 'ca.pem'})" in out.stderr, out.stderr
    server = cl.candidates[0]
    wait_for(lambda: "refused our certificate: it is not signed by a CA it trusts" in server.text(),
             10, what="the candidate's line about the refusal")
    assert "TLS handshake refused: client 127.0.0.1:" in server.text()
    # A client certificate from another CA, where one is required: the candidate refuses it.
    cl = xce_cluster(1, tls=True, require_client_cert=True)
    server = cl.candidates[0]
    config = other_config(cl, tmp_path / "wrong-cert.toml",
                          f'[tls]\nca = "{cl.tls_dir / "ca.pem"}"\ncert = "{files.cert}"\n'
                          f'key = "{files.key}"\n')
    out = xce(config, "status")
    assert out.returncode != 0
    assert f"controller {cl.address(0)} refused our certificate: it is not signed by a CA it " \
           "trusts" in out.stderr, out.stderr
    wait_for(lambda: "'s client certificate is not signed by the CA in tls.ca" in server.text(),
             10, what="the candidate's line about the client certificate")
    # The async client (every role's) says the same, once, as an authentication failure.
    _, cfg = load(config)
    from xcecore.client import AuthenticationFailed

    with pytest.raises(AuthenticationFailed, match="refused our certificate"), \
            SyncClient.open(client_config(cfg, "cli@wrong"), role="cli") as c:
        c.call("status", {})


def test_expired_certificates_are_refused_with_a_clear_message_on_both_sides(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    # A client whose certificate has expired, at a candidate that requires one.
    cl = xce_cluster(1, tls=True, require_client_cert=True)
    expired = make_host(cl.tls_dir, "expired", ["127.0.0.1"], days=1, not_before=long_ago)
    config = other_config(cl, tmp_path / "expired-client.toml",
                          f'[tls]\nca = "{cl.tls_dir / "ca.pem"}"\ncert = "{expired.cert}"\n'
                          f'key = "{expired.key}"\n')
    out = xce(config, "status")
    assert out.returncode != 0
    assert f"controller {cl.address(0)} refused our certificate: it has expired" in out.stderr, \
        out.stderr
    server = cl.candidates[0]
    wait_for(lambda: "'s client certificate has expired" in server.text(), 10,
             what="the candidate's line about the expired client certificate")
    # No client certificate at all, where one is required.
    config = other_config(cl, tmp_path / "no-cert.toml", f'[tls]\nca = "{cl.tls_dir / "ca.pem"}"\n')
    out = xce(config, "status")
    assert out.returncode != 0
    assert f"controller {cl.address(0)} requires a client certificate" in out.stderr, out.stderr

    # A candidate whose own certificate has expired.
    root = tmp_path / "expired-server"
    make_ca(root / "tls")
    make_host(root / "tls", "host", ["127.0.0.1"], days=1, not_before=long_ago)
    stale = LocalCluster(root, 1, tls=True)
    try:
        cand = stale.start_candidate(0)
        wait_for(lambda: "candidate started" in cand.text() or not cand.alive(), 30,
                 what="the candidate with the expired certificate listening")
        out = xce(stale.config_path, "status")
        assert out.returncode != 0
        assert f"controller {stale.address(0)}'s certificate has expired" in out.stderr, out.stderr
        wait_for(lambda: "refused our certificate: it has expired" in cand.text(), 10,
                 what="the candidate's line about its refused certificate")
    finally:
        stale.close()


def test_a_certificate_for_another_host_and_a_plain_candidate_are_named(
        xce_cluster: Callable[..., LocalCluster], tmp_path: Path) -> None:
    root = tmp_path / "elsewhere"
    make_ca(root / "tls")
    make_host(root / "tls", "host", ["ctl9.example"])  # not the address the clients dial
    cl = LocalCluster(root, 1, tls=True)
    try:
        cand = cl.start_candidate(0)
        wait_for(lambda: "candidate started" in cand.text() or not cand.alive(), 30,
                 what="the candidate listening")
        out = xce(cl.config_path, "status")
        assert out.returncode != 0
        assert f"controller {cl.address(0)}'s certificate is not for that address" in out.stderr, \
            out.stderr
    finally:
        cl.close()
    plain = xce_cluster(1)  # TLS client, plain candidate
    config = other_config(plain, tmp_path / "tls-to-plain.toml",
                          f'[tls]\nca = "{root / "tls" / "ca.pem"}"\n')
    out = xce(config, "status")
    assert out.returncode != 0
    assert f"controller {plain.address(0)} does not speak TLS (is [tls] set on both sides?)" \
        in out.stderr, out.stderr


def test_tls_config_errors_name_the_file(tmp_path: Path, xce_cluster: Any) -> None:
    cl = xce_cluster(1, start=False)
    bad = other_config(cl, tmp_path / "missing.toml", f'[tls]\nca = "{tmp_path / "nope.pem"}"\n')
    out = xce(bad, "status")
    assert out.returncode != 0 and f"tls.ca '{tmp_path / 'nope.pem'}' does not exist" in out.stderr
    half = other_config(cl, tmp_path / "half.toml", f'[tls]\nca = "x"\ncert = "{tmp_path}"\n')
    out = xce(half, "status")
    assert out.returncode != 0 and "[tls]: cert and key go together" in out.stderr, out.stderr


def test_the_same_tls_section_read_again_is_the_same_tls(tmp_path: Path) -> None:
    """A reconfiguration (SIGHUP) compares the settings read again: unchanged [tls] files must
    not show up as a change that needs a restart."""
    from xcecore.tls import server_tls

    make_ca(tmp_path)
    files = make_host(tmp_path, "h", ["127.0.0.1"])
    section = {"ca": str(tmp_path / "ca.pem"), "cert": str(files.cert), "key": str(files.key)}
    assert server_tls(section, what="x") == server_tls(section, what="x")
    assert server_tls(section, what="x") != server_tls({**section, "require_client_cert": True},
                                                       what="x")


def test_a_plain_client_of_a_tls_candidate_is_told_what_may_be_wrong(
        tmp_path: Path) -> None:
    """Neither side speaks first to the other (each waits for its peer's hello): the plain
    client's error names the candidate's silence and [tls] as a cause, at once, not only
    "did not answer"."""
    cl = LocalCluster(tmp_path / "tls-cluster", 1, tls=True)
    try:
        cl.start()
        config = other_config(cl, tmp_path / "plain-to-tls.toml", "")
        out = xce(config, "status")
        assert out.returncode == 1
        # (within the attempt's time: the last one is cut short by the command's deadline)
        assert f"{cl.address(0)} accepted the connection but sent no hello within " in out.stderr
        assert "s (hung, overloaded, or it has [tls] set and this client has not)" in out.stderr, \
            out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    finally:
        cl.close()
