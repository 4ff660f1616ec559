"""Clients that give up during the handshake (a busy candidate) are counted, not logged one by
one: a join storm must not write thousands of warning lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from ctl_testlib import running
from loguru import logger
from xce_controller import server

from xcecore import wire

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_abandoned_handshakes_are_reported_as_one_line(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(server, "ABANDONED_REPORT_INTERVAL", 0.2)
    lines: list[tuple[str, str]] = []
    handler = logger.add(lambda m: lines.append((m.record["level"].name, m.record["message"])),
                         level="DEBUG", format="{message}")
    try:
        async with running(tmp_path / "state") as ctl:
            for _ in range(5):  # read the challenge, then leave without answering
                async with await anyio.connect_tcp("127.0.0.1", ctl.port) as raw:
                    await wire.read_message(BufferedByteReceiveStream(raw))
            with anyio.fail_after(10):
                while _reported(lines) < 5:
                    await anyio.sleep(0.05)
            async with await anyio.connect_tcp("127.0.0.1", ctl.port) as raw:  # garbage: named
                await wire.read_message(BufferedByteReceiveStream(raw))
                await raw.send(b"\x00\x00\x00\x05nope!")
                with anyio.fail_after(5):
                    while not any("bad handshake" in m for _, m in lines):
                        await anyio.sleep(0.05)
    finally:
        logger.remove(handler)
    summary = [(lv, m) for lv, m in lines if "closed the connection before finishing" in m]
    # One line per interval (the five may straddle two), never one per client.
    assert 1 <= len(summary) <= 2 and _reported(lines) == 5, lines
    assert {lv for lv, _ in summary} == {"WARNING"}
    # One line each at debug level only; a garbage handshake still gets its own warning.
    assert sum("during the handshake" in m for lv, m in lines if lv == "DEBUG") == 5
    assert any(lv == "WARNING" and "bad handshake" in m for lv, m in lines)


def _reported(lines: list[tuple[str, str]]) -> int:
    """How many abandoned handshakes the summary lines add up to."""
    import re

    return sum(int(n) for _, m in lines
               for n in re.findall(r"(\d+) client\(s\) closed the connection before finishing", m))
