"""The heartbeat record, hang detection and fencing of the file backend, piece by piece.

The decisions are pure (HangWatch, same-host checks, /proc/locks parsing) and tested on
values; the kill is tested on real processes holding real locks.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from xce_controller import fencing
from xce_controller.election import FileLockElection
from xce_controller.fencing import (
    RECORD_SIZE,
    BeatFile,
    BeatRecord,
    FenceMark,
    FenceRefused,
    HangWatch,
    Identity,
)
from xce_controller.settings import config_of, settings_from_config

ME = Identity(100, 5000, b"b" * 16, 11, 22)


def record(seq: int, mono: float, *, who: Identity = ME, term: int = 1, interval: float = 0.05) -> BeatRecord:
    return BeatRecord(who, 1, 2, term, seq, mono, 0.0, interval, "127.0.0.1:7600")


def test_records_round_trip_and_torn_bytes_are_refused() -> None:
    rec = record(7, 12.5)
    data = rec.pack()
    assert BeatRecord.unpack(data) == rec
    torn = data[:20] + bytes([data[20] ^ 0xFF]) + data[21:]
    assert BeatRecord.unpack(torn) is None
    assert BeatRecord.unpack(b"\0" * len(data)) is None  # never written
    mark = FenceMark(3, 42, 1.5, "no heartbeat for 2.1 s")
    assert FenceMark.unpack(mark.pack()) == mark
    assert FenceMark.unpack(mark.pack()[:-1] + b"x") is None


def test_progress_resets_and_staleness_needs_both_clocks() -> None:
    w = HangWatch(2.0)
    assert not w.stale(record(1, 100.0), 0.0, 100.0)
    assert not w.stale(record(1, 100.0), 1.9, 101.9)  # unchanged, but not for long enough
    assert not w.stale(record(2, 101.9), 2.0, 102.0)  # it beat: the count restarts
    w2 = HangWatch(2.0, max_gap=10.0)
    w2.stale(record(2, 101.9), 2.0, 102.0)
    # Watched unchanged for 2.0 s, but its last beat is only 2.0 s old: a stall that began
    # right after a beat may have lasted less than hung_timeout. One more interval is needed.
    assert not w2.stale(record(2, 101.9), 4.0, 103.94)
    assert w2.stale(record(2, 101.9), 4.0, 103.96)


def test_a_standby_that_was_paused_itself_starts_counting_again() -> None:
    w = HangWatch(2.0, max_gap=0.25)
    for i in range(10):  # read every 0.1 s: watched
        assert not w.stale(record(1, 0.0), i * 0.1, i * 0.1)
    # Its own host was frozen for 5 s (the primary too, most likely): no verdict on resuming,
    # although the record is 5.9 s old; it watches a whole hung_timeout again first.
    assert not w.stale(record(1, 0.0), 5.9, 5.9)
    for k in range(1, 19):  # 6.0 .. 7.7: less than hung_timeout watched since resuming
        assert not w.stale(record(1, 0.0), 5.9 + k * 0.1, 5.9 + k * 0.1)
    assert w.stale(record(1, 0.0), 7.95, 7.95)


def test_no_record_is_never_stale_and_a_silent_holder_gets_its_own_timeout() -> None:
    w = HangWatch(1.0, max_gap=100.0)
    assert not w.stale(None, 0.0, 0.0)
    assert not w.stale(None, 50.0, 50.0)
    assert not w.holder_stale(77, 0.0)
    assert not w.holder_stale(77, 0.9)
    assert w.holder_stale(77, 1.0)
    assert not w.holder_stale(78, 1.1)  # another holder: counted afresh


def test_only_a_process_of_this_host_and_pid_namespace_may_be_fenced() -> None:
    assert ME.same_host(ME) is None
    assert "another host" in (ME.same_host(Identity(100, 5000, b"c" * 16, 11, 22)) or "")
    assert "pid namespace" in (ME.same_host(Identity(100, 5000, b"b" * 16, 12, 22)) or "")
    assert "network namespace" in (ME.same_host(Identity(100, 5000, b"b" * 16, 11, 23)) or "")


def test_lock_holders_from_proc_locks() -> None:
    dev = os.makedev(0xFE, 0x01)
    text = textwrap.dedent("""\
        1: FLOCK  ADVISORY  WRITE 4321 fe:01:99 0 EOF
        1: -> FLOCK  ADVISORY  WRITE 4322 fe:01:99 0 EOF
        2: FLOCK  ADVISORY  READ  4323 fe:01:99 0 EOF
        3: POSIX  ADVISORY  WRITE 4324 fe:01:99 0 EOF
        4: FLOCK  ADVISORY  WRITE 4325 fe:01:98 0 EOF
        """)
    assert fencing.lock_holders(dev, 99, text) == [4321]


def test_lock_holders_sees_this_process(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        assert os.getpid() in fencing.lock_holders(st.st_dev, st.st_ino)
    finally:
        os.close(fd)


def _locker(path: Path) -> subprocess.Popen[bytes]:
    code = (f"import fcntl, os, sys, time; fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"
    return proc


def test_kill_verified_kills_the_lock_holder_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "primary.lock"
    holder = _locker(path)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        st = os.stat(path)
        with pytest.raises(FenceRefused, match="does not hold"):
            fencing.kill_verified(bystander.pid, None, st.st_dev, st.st_ino)
        assert bystander.poll() is None
        with pytest.raises(FenceRefused, match="no longer the process"):
            fencing.kill_verified(holder.pid, 1, st.st_dev, st.st_ino)  # a recycled pid
        assert holder.poll() is None
        fencing.kill_verified(holder.pid, fencing.starttime(holder.pid), st.st_dev, st.st_ino)
        assert holder.wait(10) == -signal.SIGKILL
        with pytest.raises(FenceRefused, match="exited"):
            fencing.kill_verified(holder.pid, None, st.st_dev, st.st_ino)
    finally:
        for p in (holder, bystander):
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_the_beat_record_is_one_page_allocated_up_front(tmp_path: Path) -> None:
    a = FileLockElection(str(tmp_path), "h:1", hung_timeout=2.0)
    b = BeatFile(tmp_path)
    try:
        assert a.try_acquire()
        assert os.stat(tmp_path / fencing.BEAT_NAME).st_size == RECORD_SIZE
        first = b.read_beat()
        assert first is not None and first.term == 1 and first.who.pid == os.getpid()
        for _ in range(100):
            a.heartbeat()
        rec = b.read_beat()
        assert rec is not None and rec.seq == first.seq + 100 and rec.address == "h:1"
        assert os.stat(tmp_path / fencing.BEAT_NAME).st_size == RECORD_SIZE  # overwritten in place
        assert os.stat(tmp_path / fencing.BEAT_NAME).st_blocks * 512 >= RECORD_SIZE
    finally:
        b.close()
        a.release()


def test_terms_grow_across_primaries_and_fence_marks(tmp_path: Path) -> None:
    a = FileLockElection(str(tmp_path), "h:1")
    assert a.try_acquire() and a.term == 1
    a.release()
    BeatFile(tmp_path).write_fence(FenceMark(5, 1, 0.0, "test"))
    b = FileLockElection(str(tmp_path), "h:2")
    assert b.try_acquire() and b.term == 6  # above the fenced term: its own mark is not its
    assert b.still_primary() is None
    b.release()


def test_still_primary_says_why_not(tmp_path: Path) -> None:
    a = FileLockElection(str(tmp_path), "h:1")
    assert "does not hold" in (a.still_primary() or "")
    assert a.try_acquire() and a.still_primary() is None
    BeatFile(tmp_path).write_fence(FenceMark(a.term, 4242, time.time(), "no heartbeat for 2.2 s"))
    assert "fenced by pid 4242" in (a.still_primary() or "")
    a.release()
    c = FileLockElection(str(tmp_path), "h:3")
    assert c.try_acquire() and c.still_primary() is None
    os.rename(tmp_path / "primary.lock", tmp_path / "old.lock")
    assert "gone" in (c.still_primary() or "")
    (tmp_path / "primary.lock").write_text("")
    assert "replaced" in (c.still_primary() or "")
    c.release()


def test_a_standby_fences_a_stopped_primary_of_its_host(tmp_path: Path) -> None:
    """Two elections in real processes: the standby SIGKILLs the SIGSTOPped primary."""
    code = textwrap.dedent(f"""
        import time
        from xce_controller.election import FileLockElection
        e = FileLockElection({str(tmp_path)!r}, "h:1", hung_timeout=0.5)
        assert e.try_acquire()
        print("primary", flush=True)
        while True:
            e.heartbeat()
            time.sleep(e.beat_interval)
    """)
    primary = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    standby = FileLockElection(str(tmp_path), "h:2", hung_timeout=0.5)
    try:
        assert primary.stdout is not None and primary.stdout.readline() == b"primary\n"
        assert not standby.try_acquire()
        won: list[bool] = []
        import threading

        t = threading.Thread(target=lambda: won.append(standby.wait()), daemon=True)
        t.start()
        time.sleep(1.0)  # the primary beats: nothing happens (a real second of watching)
        assert primary.poll() is None and not won
        os.kill(primary.pid, signal.SIGSTOP)
        assert primary.wait(20) == -signal.SIGKILL
        t.join(20)
        assert won == [True] and standby.is_primary
        assert standby.fenced and f"pid {primary.pid}" in standby.fenced[0]
        mark = BeatFile(tmp_path).read_fence()
        assert mark is not None and mark.fencer == os.getpid() and mark.term == 1
    finally:
        if primary.poll() is None:
            primary.kill()
            primary.wait(10)
        standby.release()


def test_a_takeover_is_promised_from_half_the_timeout_on() -> None:
    w = HangWatch(2.0, max_gap=10.0)
    rec = record(1, 100.0)
    w.stale(rec, 0.0, 100.0)
    assert w.takeover_in(rec, 0.0, 100.0) is None
    w.stale(rec, 0.99, 100.99)
    assert w.takeover_in(rec, 0.99, 100.99) is None  # silent less than half of hung_timeout
    w.stale(rec, 1.2, 101.2)
    # Both clocks must pass: watched 2.0 s (at 2.0) and beat 2.05 s old (at 102.05 = 2.05 here).
    assert w.takeover_in(rec, 1.2, 101.2) == pytest.approx(0.85)
    w.stale(rec, 2.05, 102.05)
    assert w.takeover_in(rec, 2.05, 102.05) == pytest.approx(0.0, abs=1e-9)
    assert w.stale(rec, 2.06, 102.06) and w.takeover_in(rec, 2.06, 102.06) == 0.0
    beat = record(2, 102.1)
    w.stale(beat, 2.1, 102.1)  # it beat: no promise
    assert w.takeover_in(beat, 2.1, 102.1) is None
    assert w.takeover_in(rec, 2.1, 102.1) is None  # not the record the watch follows
    assert w.takeover_in(None, 2.1, 102.1) is None


def test_a_standby_promises_to_take_over_from_a_stopped_primary(tmp_path: Path) -> None:
    """Real processes: while the SIGSTOPped primary is silent, the standby's promise names a
    moment near its fence; it names none for another primary, and none once it is primary."""
    code = textwrap.dedent(f"""
        import time
        from xce_controller.election import FileLockElection
        e = FileLockElection({str(tmp_path)!r}, "h:1", hung_timeout=1.0)
        assert e.try_acquire()
        e.publish()
        print("primary", flush=True)
        while True:
            e.heartbeat()
            time.sleep(e.beat_interval)
    """)
    primary = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    standby = FileLockElection(str(tmp_path), "h:2", hung_timeout=1.0)
    try:
        assert primary.stdout is not None and primary.stdout.readline() == b"primary\n"
        assert not standby.try_acquire()
        import threading

        won: list[bool] = []
        t = threading.Thread(target=lambda: won.append(standby.wait()), daemon=True)
        t.start()
        assert standby.takeover_in("h:1") is None
        os.kill(primary.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        promises: list[tuple[float, float]] = []
        deadline = stopped + 20
        while not won and time.monotonic() < deadline:
            eta = standby.takeover_in("h:1")
            if eta is not None:
                promises.append((time.monotonic() - stopped, eta))
                assert standby.takeover_in("h:3") is None  # another candidate published itself
            time.sleep(0.01)
        t.join(20)
        assert won == [True] and primary.wait(20) == -signal.SIGKILL
        assert promises, "the standby never promised a takeover"
        first_seen, first_eta = promises[0]
        assert first_seen >= 0.45  # not before half of hung_timeout of silence
        # Every promise points at the same moment (about hung_timeout + one beat after the
        # stop), give or take the polling of this loop and the watch's own reads.
        for seen, eta in promises:
            assert 0.0 <= eta <= 0.65
            assert abs((seen + eta) - (first_seen + first_eta)) < 0.2 or eta == 0.0
        assert standby.takeover_in("h:1") == 0.0  # the lock is its own: promoting
        standby.publish()  # the promotion's first step: from now on it says "primary"
        assert standby.takeover_in("h:1") is None and standby.takeover_in(None) is None
    finally:
        if primary.poll() is None:
            os.kill(primary.pid, signal.SIGCONT)
            primary.kill()
            primary.wait(10)
        standby.release()


def test_hung_timeout_is_validated() -> None:
    def settings(**controller: object) -> float:
        return settings_from_config(config_of({}, {"state_dir": "/tmp/x", **controller}), None).hung_timeout

    assert settings() == 2.0
    assert settings(hung_timeout=0) == 0
    assert settings(hung_timeout=0.5) == 0.5
    for bad in (0.2, -1, "2", True):
        with pytest.raises(ValueError, match="hung_timeout"):
            settings(hung_timeout=bad)
