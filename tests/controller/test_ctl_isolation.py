"""One request's data never ends the controller: values nested too deep to encode, values
that cannot even be printed, and (with the validation edge and the arguments check taken
away) changes that cannot be encoded after they were applied: each is that request's error,
the state is unchanged, and everyone else is served."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from ctl_testlib import Proc, RawClient, running, start_controller, wait_listening
from test_ctl_fuzz import SyncClient
from xce_controller import server as server_mod
from xce_controller.ops import OPS, Caller, OpSpec
from xce_controller.state import ClusterState
from xce_controller.store import SQLiteStore

pytestmark = pytest.mark.timeout(60)


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    """The JSON of a value nested ``depth`` levels deep (objects and lists by turns): the
    client library cannot encode it either, so it is written by hand."""
    out = leaf
    for i in range(depth):
        out = b"[" + out + b"]" if i % 2 else b'{"k":' + out + b"}"
    return out


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def request(n: int, op: str, args: bytes) -> bytes:
    """A request frame whose arguments' JSON is given."""
    return raw_frame(b'{"id":' + str(n).encode() + b',"op":' + orjson.dumps(op) + b',"args":'
                     + args + b"}")


DEEP_JOIN = b'{"role":"worker","attrs":{"hname":"deep","x":' + nested(300) + b"}}"


def sync_raw(c: SyncClient, op: str, args: bytes) -> dict[str, Any]:
    c.sock.sendall(request(99, op, args))
    while True:
        msg = c.recv()
        if "push" not in msg:
            return msg


async def async_raw(c: RawClient, op: str, args: bytes) -> dict[str, Any]:
    n = next(c.ids)
    await c.stream.send(request(n, op, args))
    return await c.reply(n)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    base: Path = tmp_path_factory.mktemp("isolation")
    proc = start_controller(base / "state", base)
    try:
        wait_listening(proc.address, state="primary")
        yield proc
    finally:
        proc.kill()


def serving(proc: Proc) -> dict[str, Any]:
    """The candidate is alive and answers a fresh client; its hosts."""
    assert proc.popen.poll() is None, proc.log.read_text()[-3000:]
    c = SyncClient(proc.address, "apiserver@check")
    try:
        assert c.call("hello")["ok"]
        hosts: dict[str, Any] = c.call("hostinfo")["result"]
        return hosts
    finally:
        c.close()


def test_a_join_nested_300_deep_is_refused_and_changes_nothing(live: Proc) -> None:
    before = serving(live)
    w = SyncClient(live.address, "worker@deep")
    try:
        reply = sync_raw(w, "join", DEEP_JOIN)
        assert reply["ok"] is False and reply["error"]["code"] == "INVALID"
        assert serving(live) == before  # no host "deep"
        # not joined: a member's op says so; a sound join on the same connection works
        assert w.call("heartbeat")["error"]["code"] == "NOT_JOINED"
        assert w.call("join", {"role": "worker", "attrs": {"hname": "deep", "ncpus": 1}})["ok"]
    finally:
        w.close()


def test_update_resvals_nested_300_deep_is_refused(live: Proc) -> None:
    w = SyncClient(live.address, "worker@rv")
    try:
        assert w.call("join", {"role": "worker", "attrs": {"hname": "rv", "ncpus": 1}})["ok"]
        assert w.call("update_resvals", {"values": {"r1m": 0.5}})["ok"]
        reply = sync_raw(w, "update_resvals", b'{"values":{"r1m":' + nested(300) + b"}}")
        assert reply["ok"] is False and reply["error"]["code"] == "INVALID"
        c = SyncClient(live.address, "apiserver@rv")
        assert c.call("resval", {"host": "rv"})["result"]["hosts"]["rv"] == {"r1m": 0.5}
        c.close()
    finally:
        w.close()
    serving(live)


@pytest.mark.parametrize("field", ["op", "id", "rid", "args"])
def test_values_too_deep_to_print_are_refused(live: Proc, field: str) -> None:
    deep = b"[" * 1000 + b"]" * 1000  # decodes (orjson reads 1,024 levels); str() would recurse
    parts = {"id": b"7", "op": b'"hello"', "args": b"{}"}
    parts[field] = deep
    body = b"{" + b",".join(b'"' + k.encode() + b'":' + v for k, v in parts.items()) + b"}"
    c = SyncClient(live.address, "apiserver@deep")
    try:
        c.sock.sendall(raw_frame(body))
        reply = c.recv()
        assert reply["ok"] is False and reply["error"]["code"] == "INVALID", reply
        assert c.call("hello")["ok"]  # the same connection goes on
    finally:
        c.close()
    serving(live)


def test_a_read_with_deep_unhashable_arguments_is_its_own_error(live: Proc) -> None:
    c = SyncClient(live.address, "apiserver@hosts")
    try:
        reply = sync_raw(c, "hostinfo", b'{"hosts":[' + nested(200, b"{}") + b"]}")
        assert reply["ok"] is False and reply["error"]["code"] in ("INVALID", "INTERNAL")
        assert c.call("hello")["ok"]
    finally:
        c.close()
    serving(live)


# -- the controller's own isolation, with the validation edge (and its arguments check) gone --


def no_edge(op: str, caller: Caller, args: dict[str, Any], state: ClusterState,
            policy: Any) -> tuple[OpSpec, dict[str, Any]]:
    """check_call without any validation: only the op table's lookup (and whom it acts for)."""
    return OPS[op], {**args, "user": args.get("user", caller.who.user)}


def without_the_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    """No validation edge at all: neither the op schemas nor the wire's generic bound."""
    monkeypatch.setattr(server_mod, "check_call", no_edge)
    monkeypatch.setattr(server_mod.wire, "find_violation", lambda value, bound: None)


def stored_hosts(state_dir: Path) -> dict[str, Any]:
    store = SQLiteStore(str(state_dir))
    store.open()
    try:
        return store.head().hosts
    finally:
        store.close()


@pytest.mark.anyio
async def test_without_the_edge_the_arguments_check_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_the_edge(monkeypatch)
    async with running(tmp_path) as ctl:
        w = await RawClient.connect(ctl.address, "worker@deep")
        reply = await async_raw(w, "join", DEEP_JOIN)
        assert reply["error"]["code"] == "INVALID" and "cannot be stored" in reply["error"]["message"]
        assert "deep" not in ctl.state.hosts and "worker@deep" not in ctl.state.members
        assert not any(c.caller.joined for c in ctl.conns.values())


@pytest.mark.anyio
async def test_a_change_that_cannot_be_encoded_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_the_edge(monkeypatch)
    monkeypatch.setattr(server_mod, "check_encodable", lambda op, args: None)
    async with running(tmp_path) as ctl:
        good = await RawClient.connect(ctl.address, "worker@good")
        await good.ok("join", {"role": "worker", "attrs": {"hname": "good", "ncpus": 2}})
        admin = await RawClient.connect(ctl.address, "cli@x")
        # Writes of another client in flight while the bad change is made and undone.
        sent = [await admin.send("jobsubmit", {"command": f"c{i}"}, rid=f"k{i}")
                for i in range(20)]
        bad = await RawClient.connect(ctl.address, "worker@deep")
        reply = await async_raw(bad, "join", DEEP_JOIN)
        assert reply["error"]["code"] == "INVALID" and "cannot be encoded" in reply["error"]["message"]
        results = [await admin.reply(n) for n in sent]
        assert all(r["ok"] for r in results)
        # A request made after the refusal waits for the rollback: it sees none of it.
        assert [h["name"] for h in (await admin.ok("hostinfo"))["hosts"]] == ["good"]
        assert ctl.storage.rollbacks == 1
        assert "deep" not in ctl.state.hosts and "worker@deep" not in ctl.state.members
        assert not any(c.caller.joined for c in ctl.conns.values() if c.caller.identity == "worker@deep")
        jobs = (await admin.ok("jobinfo"))["jobs"]
        assert len(jobs) == 20
        # what memory holds is what the store holds
        assert orjson.loads(orjson.dumps(ctl.state.hosts)) == stored_hosts(tmp_path)
        assert await admin.ok("jobsubmit", {"command": "after"})


@pytest.mark.anyio
async def test_a_poisoned_record_costs_requests_not_the_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A volatile value that cannot be encoded gets into memory (both checks gone): every
    later request that would encode it gets its own error, a member whose state cannot be
    built is disconnected, and the host's next durable change rolls the record back to the
    store's, healing it."""
    without_the_edge(monkeypatch)
    monkeypatch.setattr(server_mod, "check_encodable", lambda op, args: None)
    async with running(tmp_path, host_timeout=1.0) as ctl:
        w = await RawClient.connect(ctl.address, "worker@p")
        await w.ok("join", {"role": "worker", "attrs": {"hname": "p", "ncpus": 1}})
        reply = await async_raw(w, "update_resvals", b'{"values":{"x":' + nested(300) + b"}}")
        assert reply["ok"] is False
        cli = await RawClient.connect(ctl.address, "apiserver@x")
        await w.ok("heartbeat")  # (beating: the host does not expire, so the poison stays)
        assert (await cli.call("hostinfo"))["error"]["code"] == "INVALID"  # its own error
        sched = await RawClient.connect(ctl.address, "scheduler@s")
        await w.ok("heartbeat")
        await sched.call("join", {"role": "scheduler"})  # its state cannot be built: dropped
        with anyio.fail_after(10):
            while any(c.caller.identity == "scheduler@s" for c in ctl.conns.values()):
                await anyio.sleep(0.01)
        assert (await cli.call("hello"))["ok"]
        # The worker stops beating: the host expires, its row cannot be encoded, and the
        # record goes back to what the store has, resource values included.
        await w.aclose()
        with anyio.fail_after(10):
            while ctl.state.hosts["p"]["resvals"] != {}:
                await anyio.sleep(0.02)
        assert (await cli.ok("hostinfo"))["hosts"][0]["name"] == "p"


@pytest.mark.parametrize("text", [b'"\\ud800"', b'"x\\udc00"', b'"\\udbff\\u0041"'])
def test_the_decoder_yields_no_string_the_encoder_refuses(text: bytes) -> None:
    """Why check_encodable need not encode arguments one level deep (isolation._FLAT): orjson
    refuses a lone surrogate when decoding, so no decoded string fails to encode..."""
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)


@pytest.mark.parametrize("number", [b"18446744073709551616", b"-9223372036854775809", b"1" * 400])
def test_the_decoder_yields_no_integer_the_encoder_refuses(number: bytes) -> None:
    """... and an integer beyond 64 bits decodes as a float (or not at all), which encodes."""
    try:
        value = orjson.loads(number)
    except orjson.JSONDecodeError:
        return
    assert type(value) is float
    orjson.dumps([[[[[[[[{"x": value}]]]]]]]])


def test_check_encodable_passes_flat_arguments_and_refuses_deep_ones() -> None:
    from xce_controller.isolation import check_encodable

    from xcecore.wire import RemoteError

    flat = orjson.loads(b'{"command":"sleep 1","ntasks":2,"x":1.5,"b":true,"n":null,'
                        b'"big":18446744073709551615}')
    check_encodable("jobsubmit", flat)  # one level: nothing can fail to encode
    with pytest.raises(RemoteError, match="cannot be stored"):
        check_encodable("join", orjson.loads(b'{"role":"worker","attrs":' + nested(250) + b"}"))
