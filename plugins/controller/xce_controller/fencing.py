"""The file backend's heartbeat record, hang detection and fencing (one host only).

The primary renews a record in ``<state_dir>/primary.beat`` while its event loop makes progress
(from a thread that watches the loop's progress stamp: :mod:`xce_controller.beat`); a standby
that sees no progress for ``hung_timeout`` fences the primary before it can take the lock:
it writes a fence mark into the same file, then SIGKILLs the process that holds the lock.

Why it is built this way:

- **The record never needs a new disk block.** ``primary.beat`` is one page, allocated
  (``posix_fallocate``) when a candidate starts, and every beat overwrites its first slot in
  place (``pwrite``, no fsync: page-cache coherence is all a reader on the same host needs).
  A full state directory therefore never stops the beats of a healthy primary, so a full
  disk is never mistaken for a hang. A file system that allocates on every overwrite (btrfs,
  ZFS: copy on write) loses that property; the state directory belongs on ext4, xfs or tmpfs.
- **Torn reads are detected**, not prevented: each slot ends with a CRC32 of its bytes, and a
  reader retries a slot whose CRC does not match.
- **A pause shorter than ``hung_timeout`` is never taken for a hang.** A primary beats every
  ``beat_interval``; a standby fences only when the record has not changed for
  ``hung_timeout`` of its own observation *and* the record's last beat (the primary's
  ``CLOCK_MONOTONIC``, the same clock on one host) is older than ``hung_timeout +
  beat_interval``: the stall that caused that gap began at most one interval after the last
  beat, so it has lasted longer than ``hung_timeout``. A standby that was itself not running
  for a while (its host frozen, the machine overloaded) starts counting again: the primary was
  most likely stopped by the same cause and has not had its chance to beat yet.
- **Only a process on this host is ever killed, and only the lock holder.** The record names
  its writer's boot id and pid and network namespaces; a standby whose differ (another host,
  another container, another simulated host of the fault test bed) refuses to fence and says
  so. Before the kill it checks ``/proc/locks``: the pid must hold the exclusive ``flock`` on
  this very lock file (device and inode). The kill goes through a pidfd opened before that
  check, so a recycled pid can never receive it.
- **A fenced primary that still runs does not acknowledge.** The mark is written before the
  kill; a primary checks it (and that its locked file is still the lock file) before it opens
  the gate of every commit (:meth:`FileLockElection.still_primary`). The kill is the guarantee
  (a SIGKILLed process never runs user code again); the mark covers a kill that could not be
  delivered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

BEAT_NAME = "primary.beat"
RECORD_SIZE = 4096  # one page: allocated once, then only overwritten
BEAT_OFFSET = 0
FENCE_OFFSET = 512
VERSION = 1

# magic, version, pad, pid, starttime, boot id, pid ns, net ns, lock dev, lock ino, term, seq,
# mono ns of this beat, wall time, beat interval (us), address
_BEAT = struct.Struct("<4sHHIQ16sQQQQQQQdI64s")
# magic, version, pad, fenced term, fencer pid, wall time, reason
_FENCE = struct.Struct("<4sHHQId160s")
_CRC = struct.Struct("<I")
_BEAT_MAGIC = b"XCEB"
_FENCE_MAGIC = b"XCEF"


class FenceRefused(Exception):
    """The primary cannot be fenced from here (another host, not the lock holder, ...)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a process is and where: enough to tell whether a pid here means that process."""

    pid: int
    starttime: int  # clock ticks after boot (/proc/PID/stat field 22): tells reused pids apart
    boot_id: bytes
    pid_ns: int
    net_ns: int

    def same_host(self, other: Identity) -> str | None:
        """None when ``other`` runs where a pid of ours names it; else why not."""
        if self.boot_id != other.boot_id:
            return "it runs on another host (another boot id)"
        if self.pid_ns != other.pid_ns:
            return "it runs in another pid namespace (a container?)"
        if self.net_ns != other.net_ns:
            return "it runs in another network namespace (another host of this kernel)"
        return None


@dataclass(frozen=True, slots=True)
class BeatRecord:
    """The primary's slot: who holds the lock, in which term, and its latest beat."""

    who: Identity
    lock_dev: int
    lock_ino: int
    term: int
    seq: int
    mono: float  # the writer's CLOCK_MONOTONIC at this beat, seconds
    wall: float
    beat_interval: float
    address: str

    def pack(self) -> bytes:
        body = _BEAT.pack(
            _BEAT_MAGIC, VERSION, 0, self.who.pid, self.who.starttime, self.who.boot_id,
            self.who.pid_ns, self.who.net_ns, self.lock_dev, self.lock_ino, self.term, self.seq,
            int(self.mono * 1e9), self.wall, int(self.beat_interval * 1e6),
            self.address.encode()[:64],
        )
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def unpack(cls, data: bytes) -> BeatRecord | None:
        """The record in ``data``, or None (empty, torn or foreign bytes)."""
        body = _checked(data, _BEAT.size)
        if body is None:
            return None
        (magic, version, _, pid, start, boot, pidns, netns, dev, ino, term, seq, mono_ns, wall,
         interval_us, address) = _BEAT.unpack(body)
        if magic != _BEAT_MAGIC or version != VERSION:
            return None
        who = Identity(pid, start, boot, pidns, netns)
        return cls(who, dev, ino, term, seq, mono_ns / 1e9, wall, interval_us / 1e6,
                   address.rstrip(b"\0").decode(errors="replace"))


@dataclass(frozen=True, slots=True)
class FenceMark:
    """The fencer's slot: term ``term`` is over, who ended it and why."""

    term: int
    fencer: int
    wall: float
    reason: str

    def pack(self) -> bytes:
        body = _FENCE.pack(_FENCE_MAGIC, VERSION, 0, self.term, self.fencer, self.wall,
                           self.reason.encode()[:160])
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def unpack(cls, data: bytes) -> FenceMark | None:
        body = _checked(data, _FENCE.size)
        if body is None:
            return None
        magic, version, _, term, fencer, wall, reason = _FENCE.unpack(body)
        if magic != _FENCE_MAGIC or version != VERSION:
            return None
        return cls(term, fencer, wall, reason.rstrip(b"\0").decode(errors="replace"))


def _checked(data: bytes, size: int) -> bytes | None:
    if len(data) < size + _CRC.size:
        return None
    body = data[:size]
    (crc,) = _CRC.unpack_from(data, size)
    return body if zlib.crc32(body) == crc and body[:4] != b"\0\0\0\0" else None


# -- this process and others -----------------------------------------------------------------

def starttime(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (None when there is no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after the last one.
    return int(text.rsplit(")", 1)[1].split()[19])


def self_identity() -> Identity:
    """This process's identity."""
    pid = os.getpid()
    boot = uuid.UUID(Path("/proc/sys/kernel/random/boot_id").read_text().strip()).bytes
    return Identity(pid, starttime(pid) or 0, boot, os.stat("/proc/self/ns/pid").st_ino,
                    os.stat("/proc/self/ns/net").st_ino)


def lock_holders(dev: int, ino: int, locks: str | None = None) -> list[int]:
    """Pids holding an exclusive ``flock`` on the file (``dev``, ``ino``), from ``/proc/locks``.

    Waiters (``->`` lines) are not holders. A lock held from another host (NFS) or another
    pid namespace does not show a usable pid here, so it is never a holder.
    """
    text = locks if locks is not None else Path("/proc/locks").read_text()
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->":
            continue
        kind, mode, pid, where = parts[1], parts[3], parts[4], parts[5]
        if kind == "FLOCK" and mode == "WRITE" and where == want and pid.isdigit() and int(pid) > 0:
            out.append(int(pid))
    return out


# -- the record file ---------------------------------------------------------------------------

class BeatFile:
    """``<state_dir>/primary.beat``: opened (and allocated) once per candidate."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / BEAT_NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # Allocate the whole page now, while there is room: later writes only overwrite.
            # fallocate never changes bytes already there (another candidate's live record).
            os.posix_fallocate(self.fd, 0, RECORD_SIZE)
        except OSError:
            os.close(self.fd)
            raise

    def read_beat(self) -> BeatRecord | None:
        """The primary's slot (None: never written, or unreadable)."""
        return _read(self.fd, BEAT_OFFSET, _BEAT.size, BeatRecord.unpack)

    def read_fence(self) -> FenceMark | None:
        """The fencer's slot (None: nobody ever fenced here)."""
        return _read(self.fd, FENCE_OFFSET, _FENCE.size, FenceMark.unpack)

    def fence_bytes(self) -> bytes:
        """The fencer's slot, raw: one read, for a cheap "has it changed?" before each
        acknowledgement (parsed only when it has)."""
        return os.pread(self.fd, _FENCE.size + _CRC.size, FENCE_OFFSET)

    def write_beat(self, rec: BeatRecord) -> None:
        """Overwrite the primary's slot in place."""
        os.pwrite(self.fd, rec.pack(), BEAT_OFFSET)

    def write_fence(self, mark: FenceMark) -> None:
        """Overwrite the fencer's slot in place."""
        os.pwrite(self.fd, mark.pack(), FENCE_OFFSET)

    def close(self) -> None:
        """Close the file (the record stays: it is the next primary's starting term)."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


_S = TypeVar("_S")


def _read(fd: int, offset: int, size: int, parse: Callable[[bytes], _S | None]) -> _S | None:
    for _ in range(5):  # a torn read (a write in progress) fails its CRC: read again
        data = os.pread(fd, size + _CRC.size, offset)
        got = parse(data)
        if got is not None or not any(data):
            return got
    return None


# -- hang detection (pure) -------------------------------------------------------------------

@dataclass(slots=True)
class HangWatch:
    """A standby's judgement of the primary's record, one read at a time (no I/O here).

    Progress must be *watched* missing for ``hung_timeout``: when this standby itself was not
    running for longer than ``max_gap`` between two reads (its host frozen, its VM paused,
    the machine overloaded), it starts counting again, since the primary was most likely
    paused by the same cause and has not had a chance to beat yet.
    """

    hung_timeout: float
    max_gap: float = 0.25
    key: tuple[int, int, int] | None = None  # the record's (pid, term, seq): what progress is
    since: float = 0.0  # this standby's monotonic time when it first saw ``key``
    last: float | None = None  # this standby's previous read
    holder: int | None = None  # a lock holder that has written no record of its own
    holder_since: float = 0.0

    def stale(self, rec: BeatRecord | None, now: float, mono_now: float) -> bool:
        """Feed one read; True when the primary it names has made no progress long enough.

        ``now`` is this standby's monotonic clock, ``mono_now`` the host's CLOCK_MONOTONIC
        (one clock in production, two in unit tests). No record at all is never stale:
        nothing is known, so nothing is fenced.
        """
        paused = self.last is not None and now - self.last > self.max_gap
        self.last = now
        key = None if rec is None else (rec.who.pid, rec.term, rec.seq)
        if key != self.key or paused:
            self.key, self.since, self.holder = key, now, None
            return False
        if rec is None:
            return False
        return (now - self.since >= self.hung_timeout
                and mono_now - rec.mono >= self.hung_timeout + rec.beat_interval)

    def takeover_in(self, rec: BeatRecord | None, now: float, mono_now: float) -> float | None:
        """After :meth:`stale` fed ``rec``: seconds until it would judge ``rec``'s writer hung
        (0: it does already), or None while that writer has been silent for less than half of
        ``hung_timeout`` (most likely a short pause: clients are still sent to it).

        The earliest moment the two conditions of :meth:`stale` both hold; the fence itself
        comes at the next read after it, and the promotion a few milliseconds later."""
        if rec is None or self.key != (rec.who.pid, rec.term, rec.seq):
            return None
        if now - self.since < self.hung_timeout / 2:
            return None
        return max(0.0, self.since + self.hung_timeout - now,
                   self.hung_timeout + rec.beat_interval - (mono_now - rec.mono))

    def holder_stale(self, holder: int, now: float) -> bool:
        """The record is stale and another pid than its writer holds the lock: that holder
        has written no record since it took the lock. True once that lasted ``hung_timeout``
        (counted from when this standby first saw it)."""
        if holder != self.holder:
            self.holder, self.holder_since = holder, now
            return False
        return now - self.holder_since >= self.hung_timeout


def max_gap_for(hung_timeout: float) -> float:
    """The longest pause of a standby's own reads that does not restart its count."""
    return min(hung_timeout / 4, max(0.25, 5 * beat_interval_for(hung_timeout)))


def beat_interval_for(hung_timeout: float) -> float:
    """How often a primary beats: 40 beats per ``hung_timeout``, between 10 and 100 ms."""
    return min(0.1, max(0.01, hung_timeout / 40))


@contextlib.contextmanager
def verified_pidfd(pid: int, start: int | None, lock_dev: int, lock_ino: int) -> Iterator[int]:
    """A pidfd of ``pid`` once verified as the lock holder (and ``start``'s process); else
    FenceRefused. The pidfd is opened first, then the checks run: whatever they verified is
    the process a signal through it reaches, even if the pid is recycled meanwhile."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise FenceRefused(f"pid {pid} has exited") from None
    try:
        now_start = starttime(pid)
        if now_start is None or (start is not None and now_start != start):
            raise FenceRefused(f"pid {pid} is no longer the process that wrote the record")
        if pid not in lock_holders(lock_dev, lock_ino):
            raise FenceRefused(f"pid {pid} does not hold the state-dir lock")
        yield pidfd
    finally:
        os.close(pidfd)


def kill(pidfd: int) -> None:
    """SIGKILL the process of ``pidfd`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def kill_verified(pid: int, start: int | None, lock_dev: int, lock_ino: int) -> None:
    """SIGKILL ``pid`` if it is (still) the process holding the lock; else FenceRefused."""
    with verified_pidfd(pid, start, lock_dev, lock_ino) as pidfd:
        kill(pidfd)


def mono() -> float:
    """CLOCK_MONOTONIC, seconds: the clock every record's beat is stamped with."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)
