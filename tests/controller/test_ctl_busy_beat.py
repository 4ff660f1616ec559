"""A busy primary is not a hung one (issue #16); a blocked or deadlocked one still is.

Real processes on one state directory: the primary is ``loop_faults.py`` (the production
candidate with commands that load its event loop), two standbys are ``python -m
xce_controller`` with the default ``hung_timeout`` (2 s). A loop pass of 6 s that serves all
along (what a join storm of 10,000 workers made of the primary's loop) is not fenced; a loop
blocked in one call, or deadlocked, is fenced: SIGKILLed by a standby, which takes over.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ctl_testlib import REPO, start_controller, wait_listening

from xcecore.testing import free_port
from xcecore.testing.cluster import wait_for

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent
HUNG = 2.0  # the standbys' hung_timeout (the default)


class Primary:
    """``loop_faults.py`` as a process: its commands on stdin, its lines on stdout."""

    def __init__(self, state: Path, log_dir: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = log_dir / "primary.log"
        with self.log.open("wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, str(HERE / "loop_faults.py"), str(state), str(self.port)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=REPO, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: "ready" in self.lines or self.popen.poll() is not None, 30,
                 what="the primary to listen")
        assert self.popen.poll() is None, self.log.read_text()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.strip())

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)


@contextmanager
def cluster(tmp_path: Path) -> Iterator[tuple[Primary, list]]:
    state = tmp_path / "state"
    state.mkdir()
    primary = Primary(state, tmp_path)
    standbys = []
    try:
        wait_listening(primary.address, state="primary")
        for _ in range(2):
            standbys.append(start_controller(state, tmp_path))
            wait_listening(standbys[-1].address, state="standby")
        yield primary, standbys
    finally:
        primary.kill()
        for s in standbys:
            s.kill()


def fences(standbys: list) -> list[str]:
    return [line for s in standbys for line in s.text().splitlines() if "fenced the primary" in line]


def test_a_busy_loop_that_serves_is_not_fenced(tmp_path: Path) -> None:
    with cluster(tmp_path) as (primary, standbys):
        primary.send(f"busy {3 * HUNG:g}")  # one pass of 6 s: no timer fires inside it
        wait_for(lambda: "busy done" in primary.lines or primary.popen.poll() is not None, 60,
                 what="the busy pass to end")
        assert primary.popen.poll() is None, f"the busy primary was killed: {fences(standbys)}"
        # A standby that was about to fence would do so within hung_timeout of the pass's end:
        # watch that long and more.
        deadline = time.monotonic() + HUNG + 0.5
        while time.monotonic() < deadline:
            assert primary.popen.poll() is None and not fences(standbys), fences(standbys)
            time.sleep(0.1)
        wait_listening(primary.address, state="primary")


@pytest.mark.parametrize("fault", ["block 60", "deadlock"])
def test_a_blocked_or_deadlocked_loop_is_fenced(tmp_path: Path, fault: str) -> None:
    with cluster(tmp_path) as (primary, standbys):
        t0 = time.monotonic()
        primary.send(fault)
        rc = primary.popen.wait(60)  # a hang: nobody fenced it
        took = time.monotonic() - t0
        assert rc == -signal.SIGKILL, rc
        lines = fences(standbys)
        assert lines and f"(pid {primary.popen.pid}, term 1)" in lines[0], lines
        print(f"{fault}: fenced {took:.2f} s after the command (hung_timeout {HUNG:g} s)")
        new = wait_for(lambda: next((s for s in standbys if s.alive() and _is_primary(s.address)), None),
                       30, what="a standby to take over")
        assert new is not None


def _is_primary(address: str) -> bool:
    try:
        wait_listening(address, 0.5, state="primary")
    except TimeoutError:
        return False
    return True


class _Recorder:
    """An election that records its beats (the beat thread's only contact with it)."""

    def __init__(self) -> None:
        self.beats: list[float] = []

    def heartbeat(self, at: float | None = None) -> None:
        assert at is not None
        self.beats.append(at)


def test_the_beat_thread_beats_only_after_progress_and_stamps_it() -> None:
    from xce_controller.beat import LoopBeat

    election = _Recorder()
    beat = LoopBeat("test")
    beat.start(election, 0.01)
    try:
        wait_for(lambda: election.beats, 5, what="the first beat (the stamp of the start)")
        first = len(election.beats)
        # No progress: no beat, however long the thread runs.
        seen = time.monotonic()
        wait_for(lambda: time.monotonic() - seen > 0.2, 5, interval=0.01, what="a quiet spell")
        assert len(election.beats) == first
        beat.progress()
        stamp = beat.last
        wait_for(lambda: len(election.beats) > first, 5, what="a beat after progress")
        assert election.beats[first] == stamp  # the moment of the progress, not the thread's
    finally:
        beat.stop()
