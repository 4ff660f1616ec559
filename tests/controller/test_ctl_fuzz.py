"""Fuzz: random bytes and random frames at a live controller process; it keeps serving and
its state does not change."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from ctl_testlib import KEY, Proc, start_controller, wait_listening
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xce_controller.ops import OPS, SCHEMAS

from xcecore import auth, wire
from xcecore.auth.key import KeyAuth

INTS = st.integers(-(2**63), 2**63 - 1)
ARG_NAMES = sorted({name for schema in SCHEMAS.values() for name in schema.names})
# Values are never strings, so no random request can be a valid state-changing call, and
# identities are roles that may only read (or an unjoined worker): any state change is a bug.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
requests = st.fixed_dictionaries(
    {
        "id": st.one_of(INTS, st.text(max_size=4), st.none()),
        "op": st.one_of(st.sampled_from(sorted(OPS)), st.text(max_size=12), INTS),
        "args": st.one_of(st.dictionaries(st.sampled_from(ARG_NAMES), json_values, max_size=5), json_values),
    },
    optional={"rid": st.one_of(st.text(max_size=200), INTS)},
)
frames = st.one_of(
    requests.map(lambda r: wire.encode(r)),
    st.binary(max_size=64),  # garbage
    st.binary(min_size=1, max_size=32).map(lambda b: struct.pack(">I", len(b)) + b),  # non-JSON body
    json_values.map(lambda v: wire.encode(v)),  # non-object JSON
    st.integers(16 * 1024 * 1024 + 1, 2**32 - 1).map(lambda n: struct.pack(">I", n)),  # oversized
    st.just(struct.pack(">I", 0)),  # empty frame
)


class SyncClient:
    def __init__(self, address: str, identity: str, key: bytes | None = KEY, handshake: bool = True) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.dec = wire.FrameDecoder()
        self.msgs: list[dict[str, Any]] = []
        hello = self.recv()
        if handshake:
            self.sock.sendall(wire.encode(auth.client_answer(KeyAuth(key), identity, hello)))
            self.status = self.recv()

    def recv(self) -> dict[str, Any]:
        while not self.msgs:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.msgs.extend(self.dec.feed(data))
        return self.msgs.pop(0)

    def call(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        self.sock.sendall(wire.encode(wire.request(1, op, args)))
        while True:
            msg = self.recv()
            if "push" not in msg:
                return msg

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, dict[str, Any]]]:
    base: Path = tmp_path_factory.mktemp("fuzz")
    proc = start_controller(base / "state", base)
    try:
        wait_listening(proc.address, state="primary")
        c = SyncClient(proc.address, "cli@fuzz")
        w = SyncClient(proc.address, "worker@n1")
        assert w.call("join", {"role": "worker", "attrs": {"hname": "n1", "ncpus": 2}})["ok"]
        for i in range(3):
            assert c.call("jobsubmit", {"command": f"c{i}"})["ok"]
        snap = snapshot(c)
        c.close()
        yield proc, snap
        w.close()
    finally:
        proc.kill()


def snapshot(c: SyncClient) -> dict[str, Any]:
    return {op: c.call(op)["result"] for op in ("jobinfo", "hostinfo", "queueinfo", "clusterconf")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    identity=st.sampled_from(["fuzz@x", "worker@x", "scheduler@x", "apiserver@x"]),
    handshake=st.booleans(),
    payload=st.lists(frames, min_size=1, max_size=4),
)
def test_random_frames_change_nothing(live, identity, handshake, payload):
    proc, _ = live
    try:
        c = SyncClient(proc.address, identity, handshake=handshake)
        c.sock.sendall(b"".join(payload))
        c.sock.settimeout(0.05)
        try:
            while c.sock.recv(1 << 16):
                pass
        except OSError:
            pass
        c.close()
    except (ConnectionError, OSError):
        pass
    assert proc.popen.poll() is None


def test_still_serving_and_unchanged_after_fuzz(live):
    proc, snap = live
    c = SyncClient(proc.address, "cli@check")
    assert c.status["state"] == "primary"
    assert snapshot(c) == snap
    c.close()


def test_wrong_key_is_denied_and_logged(live):
    proc, _ = live
    c = SyncClient(proc.address, "apiserver@x", key=b"wrong")
    assert c.status["ok"] is False and c.status["error"]["code"] == "AUTH"
    assert c.status["error"]["reason"] == "bad_key"
    assert c.status["error"]["message"].startswith("authentication failed: bad cluster key")
    with pytest.raises(ConnectionError):
        c.recv()
    c.close()
    assert "handshake from" in proc.log.read_text() and "bad cluster key" in proc.log.read_text()


def test_oversized_frame_closes_only_that_connection(live):
    proc, _ = live
    bad = SyncClient(proc.address, "apiserver@x")
    good = SyncClient(proc.address, "apiserver@y")
    bad.sock.sendall(struct.pack(">I", 2**31))
    err = bad.recv()
    assert err["ok"] is False and err["error"]["code"] == "INVALID"
    with pytest.raises(ConnectionError):
        bad.recv()
    assert good.call("hello")["ok"]
    assert orjson.loads(orjson.dumps(good.call("status")["result"]))["state"] == "primary"
    bad.close()
    good.close()
