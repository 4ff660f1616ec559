"""A hung primary with real processes: its standbys promise the takeover, clients wait for it.

Three candidates (``xce run controller``) on loopback, the default ``hung_timeout`` (2 s) and
the test cluster's client liveness (1.5 s). The primary is SIGSTOPped while a client holds a
link to it: the standbys' handshakes stop naming it and say when they take over
(``takeover_ms``), and the client's retry of its write, after its liveness timeout, waits for
the promising standby instead of dialing the hung primary (whose handshake would only time
out) and backing off.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from xcecore import wire
from xcecore.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(120)


def hello_of(host: str, port: int) -> dict[str, Any] | None:
    """The first message of the candidate at ``host:port`` (None: no answer within 0.3 s)."""
    try:
        with socket.create_connection((host, port), timeout=0.3) as s:
            s.settimeout(0.3)
            dec = wire.FrameDecoder()
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return None
                msgs = dec.feed(chunk)
                if msgs:
                    return msgs[0]
    except OSError:
        return None


def test_standbys_promise_the_takeover_and_a_client_waits_for_it(tmp_path: Path) -> None:
    from xcecore.client import SyncClient
    from xcecore.runtime import client_config, load

    cluster = LocalCluster(tmp_path / "cluster", 3)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip()), level="DEBUG", format="{message}")
    try:
        cluster.start()
        _, config = load(cluster.config_path)
        hung = cluster.candidates[0]
        with SyncClient.open(client_config(config, "cli@hung-test"), role="cli") as c:
            c.call("jobsubmit", {"command": "true", "name": "before"}, deadline=30)
            # The write goes out on the link to the stopped primary, times out (liveness 1.5 s
            # after its send) and is retried on the standby that takes over.
            done: list[float] = []
            writer = threading.Thread(target=lambda: (
                c.call("jobsubmit", {"command": "true", "name": "after"}, deadline=30),
                done.append(time.monotonic() - stopped)), daemon=True)
            os.kill(hung.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            writer.start()
            promises: list[tuple[float, dict[str, Any]]] = []

            def promised() -> bool:
                for port in cluster.ports[1:]:
                    hello = hello_of(cluster.host, port)
                    if hello is not None and "takeover_ms" in hello:
                        promises.append((time.monotonic() - stopped, hello))
                return bool(promises)

            wait_for(promised, 30, interval=0.05, what="a standby promising the takeover")
            seen, hello = promises[0]
            assert hello["state"] == "standby" and hello["primary"] is None
            assert 0 <= hello["takeover_ms"] <= 1100
            assert seen >= 0.9  # not before half of hung_timeout of silence
            writer.join(30)
            assert done, "the write after the stop was not acknowledged"
            assert hung.popen.wait(10) == -signal.SIGKILL  # fenced
            new = cluster.wait_primary(10, exclude=0)
            assert new in (1, 2)
            jobs = c.call("jobinfo", {}, deadline=30)["jobs"]
            assert sorted(j["name"] for j in jobs) == ["after", "before"]
        hung_address = cluster.address(0)
        after_stop = lines[next(i for i, line in enumerate(lines) if "liveness timeout" in line):]
        waits = [line for line in after_stop if "takes over from a primary that stopped beating" in line]
        assert waits, "\n".join(lines)
        assert len(waits) >= 2 and all(line.endswith("(not dialing the hung primary)") for line in waits)
        dialed_hung = [line for line in after_stop
                       if f"candidate {hung_address}" in line
                       and ("accepted the connection but" in line or "did not accept" in line)]
        assert not dialed_hung, "the client dialed the hung primary:\n" + "\n".join(dialed_hung)
        print(f"SIGSTOP -> promise seen at {seen * 1000:.0f} ms, the write sent at the stop "
              f"acknowledged at {done[0] * 1000:.0f} ms")
    finally:
        logger.remove(sink)
        for proc in cluster.candidates.values():
            if proc.alive():
                os.kill(proc.pid, signal.SIGCONT)
        cluster.close()
