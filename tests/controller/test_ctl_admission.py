"""Handshakes admitted a bounded number at a time (issue #16, the re-join storm): the next
connections wait in the kernel's accept queue, and a client that connects and says nothing
holds its slot for ``ADMISSION_HOLD`` at most (it cannot keep the door shut)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from ctl_testlib import running
from xce_controller import server
from xce_controller.admission import Admission

from xcecore import wire

pytestmark = pytest.mark.timeout(60)


def test_slots_are_given_back_once_and_expire() -> None:
    opened: list[int] = []
    adm = Admission(4, hold=2.0)
    adm.on_room = lambda: opened.append(adm.active)
    releases = [adm.admit(0.0) for _ in range(4)]
    assert adm.room(0.5) == 0
    releases[0]()
    releases[0]()  # a second call gives nothing back
    assert adm.room(0.5) == 1 and opened == [3]  # three quarters held: the door opens
    assert adm.next_expiry(0.5) == pytest.approx(1.5)
    assert adm.room(2.0) == 4  # the other three held for ``hold``: given back
    releases[1]()  # late: already expired, nothing more comes back
    assert adm.active == 0 and adm.room(2.0) == 4
    assert adm.next_expiry(2.0) == 2.0


async def _hello_within(port: int, seconds: float) -> tuple[Any, bool]:
    """A connection and whether its hello came within ``seconds`` (the connection stays open)."""
    raw = await anyio.connect_tcp("127.0.0.1", port)
    with anyio.move_on_after(seconds):
        await wire.read_message(BufferedByteReceiveStream(raw))
        return raw, True
    return raw, False


@pytest.mark.anyio
async def test_handshakes_beyond_the_bound_wait_and_a_silent_client_holds_no_slot(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(server, "MAX_HANDSHAKES", 4)
    monkeypatch.setattr(server, "ADMISSION_HOLD", 1.5)
    async with running(tmp_path / "state") as ctl:
        silent = []
        for _ in range(4):  # read the hello, never answer: each holds a slot
            raw, hello = await _hello_within(ctl.port, 5.0)
            assert hello
            silent.append(raw)
        t0 = time.monotonic()
        waiting, hello = await _hello_within(ctl.port, 0.5)
        assert not hello, "a fifth handshake was admitted while four were in progress"
        # The silent ones lose their slots after ADMISSION_HOLD: the waiting one is served.
        with anyio.fail_after(10):
            await wire.read_message(BufferedByteReceiveStream(waiting))
        assert time.monotonic() - t0 >= 1.0
        # Finished handshakes give their slot back at once: a client answering is served.
        for raw in silent:
            await raw.aclose()
        await waiting.aclose()
        with anyio.fail_after(10):
            for _ in range(8):
                raw, hello = await _hello_within(ctl.port, 5.0)
                assert hello
                await raw.aclose()
