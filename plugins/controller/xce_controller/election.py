"""The built-in election: an exclusive ``flock`` on ``<state_dir>/primary.lock``.

The candidate that holds the lock is primary. The kernel drops a ``flock`` the instant its
holder dies (SIGKILL included), so a standby blocked in :meth:`FileLockElection.wait` wakes up
within milliseconds. The primary publishes its address in ``<state_dir>/primary`` (written to a
temporary file and renamed, so a reader never sees half an address), and every candidate
registers itself in ``<state_dir>/candidates/`` so ``status`` can list them.

A primary that is alive but makes no progress (SIGSTOPped, a stalled event loop, a frozen VM)
keeps the lock. So the primary also beats (:meth:`FileLockElection.heartbeat`, from a thread
while its event loop makes progress: :mod:`xce_controller.beat`) and a waiting standby watches
the beats: after ``hung_timeout`` without one it fences the primary — a fence mark, then
SIGKILL of the verified lock holder — and the kernel hands it the lock. All of that works on
one host only; see :mod:`xce_controller.fencing` for how, and why a standby on another host
refuses to fence.

A site replaces this through the ``xce_controller_election`` hook with any object offering the
same methods.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import orjson
from loguru import logger

from xce_controller import fencing
from xce_controller.fencing import BeatFile, BeatRecord, FenceMark, FenceRefused, HangWatch
from xce_controller.settings import DEFAULT_HUNG_TIMEOUT
from xcecore.log import pid_alive


class Election(Protocol):
    """What the controller needs from an election (the hook's contract)."""

    advertise: str

    def try_acquire(self) -> bool:
        """Become primary now if nobody is; never blocks."""

    def wait(self) -> bool:
        """Block until primary (True), or until :meth:`abandon` was called (False)."""

    def abandon(self) -> None:
        """Make a pending or later :meth:`wait` give up (called from another thread)."""

    def publish(self) -> None:
        """Advertise this candidate as the primary."""

    def current_primary(self) -> str | None:
        """The advertised primary's address, or None."""

    def register(self, state: str) -> None:
        """Record this candidate and its state (primary or standby) for ``status``."""

    def candidates(self) -> list[dict[str, Any]]:
        """Every live registered candidate."""

    def release(self) -> None:
        """Stop being primary (withdraw the address, drop the lock)."""

    beat_interval: float
    """How often the primary calls :meth:`heartbeat` (seconds)."""

    def heartbeat(self, at: float | None = None) -> None:
        """Primary only: show the standbys that it makes progress. Called from the primary's
        beat thread (:class:`xce_controller.beat.LoopBeat`), and only while its event loop
        serves work, so a stalled loop stops the beats. ``at`` is the ``time.monotonic()`` of
        that progress (None: now); a beat records it, not its own clock, so a standby's
        reasoning about when the loop last moved stays exact. Must not block, and must not fail
        on a full disk."""

    def still_primary(self) -> str | None:
        """Primary only, before every acknowledgement: None while it may acknowledge writes,
        else why not (it was fenced, its lock is no longer the lock). Must be cheap."""

    # Optional (the controller uses it when present):
    #
    # def takeover_in(self, primary: str | None) -> float | None:
    #     """Standby only: seconds until this standby expects to take over from ``primary``
    #     (the primary it would name to clients), which has stopped making progress; 0 when
    #     the takeover is under way; None when ``primary`` is not known to be hung, or this
    #     standby cannot take over from it. Cheap: called for every standby handshake."""


def _safe_name(address: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in address)


class FileLockElection:
    """Primary election by an exclusive ``flock`` on a file in the shared state directory."""

    def __init__(self, state_dir: str, advertise: str, *,
                 hung_timeout: float = DEFAULT_HUNG_TIMEOUT) -> None:
        self.state_dir = Path(state_dir)
        self.advertise = advertise
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "candidates").mkdir(exist_ok=True)
        self.lock_path = self.state_dir / "primary.lock"
        self.primary_path = self.state_dir / "primary"
        self.hung_timeout = hung_timeout  # 0: no hang detection (the primary still beats)
        self.beat_interval = fencing.beat_interval_for(hung_timeout or DEFAULT_HUNG_TIMEOUT)
        self._fd: int | None = None
        self._held = False
        self._abandoned = threading.Event()
        self._waiting = False
        self._mutex = threading.Lock()
        self._me = fencing.self_identity()
        self._term = 0
        self._seq = 0
        self._lock_id = (0, 0)  # (device, inode) of the lock file this candidate holds
        self._beat_failed = False
        self._lock_str = str(self.lock_path)
        self._fence_seen = b""  # the fence slot as last found harmless
        self.fenced: list[str] = []  # what this standby fenced (for tests and diagnostics)
        # (the silent primary's address, this standby's monotonic time it expects to take over
        # at): written by the watch thread, read by the event loop for every handshake
        self._takeover: tuple[str, float] | None = None
        try:
            self._beats: BeatFile | None = BeatFile(self.state_dir)
        except OSError as exc:
            self._beats = None
            logger.error(
                "controller {}: cannot allocate the heartbeat record {} ({}); a hung primary "
                "will not be detected by this candidate, and while it is primary its standbys "
                "cannot see it beat (they never fence without a record)",
                advertise, self.state_dir / fencing.BEAT_NAME, exc,
            )

    @property
    def is_primary(self) -> bool:
        """True while this candidate holds the lock."""
        return self._held

    def _open(self) -> int:
        with self._mutex:
            if self._fd is None:
                self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            return self._fd

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never blocks."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._took_lock(fd)
        return True

    def wait(self) -> bool:
        """Block (on a thread) until the lock is ours; False if abandoned meanwhile.

        While it waits, a watchdog thread fences a primary that stopped beating (when
        ``hung_timeout`` > 0); the kernel then hands the lock to a waiter.
        """
        fd = self._open()
        with self._mutex:
            if self._abandoned.is_set():
                return False
            self._waiting = True
        done = threading.Event()
        if self.hung_timeout > 0 and self._beats is not None:
            threading.Thread(target=self._watch, args=(done,), name="xce-hang-watch",
                             daemon=True).start()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            done.set()
        with self._mutex:
            self._waiting = False
            if self._abandoned.is_set():
                # Given up while blocked: hand the lock straight on to the next waiter, and
                # close the descriptor that release() left open for us.
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                self._fd = None
                if self._beats is not None:
                    self._beats.close()
                    self._beats = None
                return False
            self._took_lock(fd)
            return True

    # -- the primary's side: a term, beats, the check before acknowledging ---------------------

    def _took_lock(self, fd: int) -> None:
        """Start a term: one more than any term recorded or fenced here, beaten at once (a
        standby that sees the lock held by a pid without a record gives it ``hung_timeout``)."""
        st = os.fstat(fd)
        self._lock_id = (st.st_dev, st.st_ino)
        if self._beats is not None:
            old, mark = self._beats.read_beat(), self._beats.read_fence()
            self._term = max(old.term if old else 0, mark.term if mark else 0) + 1
        self._seq = 0
        self._held = True
        self.heartbeat()

    def heartbeat(self, at: float | None = None) -> None:
        """Overwrite the record in place with the next beat (no new blocks, no fsync).

        ``at``: the moment (CLOCK_MONOTONIC, ``time.monotonic()`` on Linux) of the progress this
        beat reports; default now. Called from one thread at a time (the beat thread, or the
        thread that took the lock before the beat thread starts)."""
        if not self._held or self._beats is None:
            return
        self._seq += 1
        rec = BeatRecord(self._me, self._lock_id[0], self._lock_id[1], self._term, self._seq,
                         fencing.mono() if at is None else at, time.time(), self.beat_interval,
                         self.advertise)
        try:
            self._beats.write_beat(rec)
        except OSError as exc:  # never seen on a page-cache overwrite; say so once if it is
            if not self._beat_failed:
                self._beat_failed = True
                logger.error("controller {}: cannot write the heartbeat record ({}); standbys "
                             "will take this primary for hung after {:g} s",
                             self.advertise, exc, self.hung_timeout)
        else:
            self._beat_failed = False

    def still_primary(self) -> str | None:
        """None while this candidate may acknowledge; else why not (fenced, lock replaced)."""
        if not self._held:
            return "it does not hold the state-dir lock"
        try:
            st = os.stat(self._lock_str)
        except OSError as exc:
            return f"the lock file {self.lock_path} is gone ({exc.strerror})"
        if (st.st_dev, st.st_ino) != self._lock_id:
            return f"the lock file {self.lock_path} was replaced: the lock it holds is no longer the lock"
        if self._beats is not None:
            raw = self._beats.fence_bytes()  # before every commit's acknowledgement: keep it cheap
            if raw != self._fence_seen:
                mark = self._beats.read_fence()
                if mark is not None and mark.term >= self._term:
                    return f"it was fenced by pid {mark.fencer} (term {mark.term}: {mark.reason})"
                self._fence_seen = raw
        return None

    @property
    def term(self) -> int:
        """This primary's term (0 before it first held the lock)."""
        return self._term

    # -- the standby's side: watch the beats, fence a hung primary -----------------------------

    def takeover_in(self, primary: str | None) -> float | None:
        """Standby only: seconds until this standby expects to fence ``primary`` (the primary
        it would name to a client), which stopped beating, and take the lock; 0 once the fence
        is under way; None when ``primary`` is not the silent one it watches (it beats, it
        is on another host, another candidate published itself meanwhile)."""
        takeover = self._takeover
        if takeover is None:
            return None
        if self._held:
            return 0.0  # the fence is done and the lock is ours: promoting (publish() ends it)
        address, at = takeover
        if primary is not None and primary != address:
            return None
        return max(0.0, at - time.monotonic())

    def _watch(self, done: threading.Event) -> None:
        """Poll the record while waiting for the lock; fence a primary that stopped beating."""
        try:
            self._watch_beats(done)
        finally:
            if self._abandoned.is_set():
                self._takeover = None

    def _watch_beats(self, done: threading.Event) -> None:
        beats = self._beats
        assert beats is not None
        watch = HangWatch(self.hung_timeout, fencing.max_gap_for(self.hung_timeout))
        reported: object = None  # the episode (record key) already reported, logged once
        fenced: object = None
        fenced_at = 0.0
        pause = self.beat_interval
        while not done.wait(pause) and not self._abandoned.is_set():
            pause = self.beat_interval
            try:
                rec = beats.read_beat()
            except OSError:
                continue
            now, mono_now = time.monotonic(), fencing.mono()
            stale = watch.stale(rec, now, mono_now)
            self._promise(rec, watch, now, mono_now, fenced, reported)
            takeover = self._takeover
            if takeover is not None and not stale:
                # Read again the moment the primary may be judged hung, not up to a beat
                # interval after it: the fence (and the promotion) come that much sooner.
                pause = min(pause, max(0.001, takeover[1] - now + 0.001))
            if not stale or rec is None:
                continue
            if fenced == watch.key:
                if now - fenced_at > 5.0:
                    fenced_at = now
                    logger.error("controller {}: the fenced primary (pid {}) still holds the "
                                 "lock 5 s after SIGKILL (uninterruptible sleep: a stuck "
                                 "disk?); waiting for the kernel to release it",
                                 self.advertise, rec.who.pid)
                continue
            try:
                if self._fence(beats, rec, watch, now):
                    fenced, fenced_at = watch.key, now
                    self._takeover = (rec.address, now)  # under way: the kernel hands the lock on
            except FenceRefused as exc:
                self._takeover = None
                if reported != watch.key:
                    reported = watch.key
                    logger.error(
                        "controller {}: the primary {} (pid {}, term {}) made no progress for "
                        "{:.1f} s, but this standby cannot fence it: {}. It will not promote "
                        "while that primary holds the lock; the outage lasts until it recovers "
                        "or is stopped. The file backend is for candidates on one host; "
                        "multi-host sites use the etcd backend ([controller] backend = \"etcd\")",
                        self.advertise, rec.address, rec.who.pid, rec.term,
                        fencing.mono() - rec.mono, exc)
            except OSError as exc:
                logger.error("controller {}: fencing the primary failed: {}; retrying",
                             self.advertise, exc)

    def _promise(self, rec: BeatRecord | None, watch: HangWatch, now: float, mono_now: float,
                 fenced: object, refused: object) -> None:
        """Update what this standby tells clients about taking over (:meth:`takeover_in`):
        ``fenced`` and ``refused`` are the episodes (record keys) it fenced, or cannot fence."""
        if fenced is not None and fenced == watch.key:
            return  # fenced already: the promise stays "under way" until the lock comes
        if refused is not None and refused == watch.key:
            self._takeover = None
            return
        eta = watch.takeover_in(rec, now, mono_now)
        if eta is None or rec is None or self._me.same_host(rec.who) is not None:
            self._takeover = None
        else:
            self._takeover = (rec.address, now + eta)

    def _fence(self, beats: BeatFile, rec: BeatRecord, watch: HangWatch, now: float) -> bool:
        """Fence ``rec``'s writer (or a lock holder that never wrote one); True when done."""
        why = self._me.same_host(rec.who)
        if why is not None:
            raise FenceRefused(why)
        assert self._fd is not None
        st = os.fstat(self._fd)
        dev, ino = st.st_dev, st.st_ino
        holders = fencing.lock_holders(dev, ino)
        if rec.who.pid in holders and (rec.lock_dev, rec.lock_ino) == (dev, ino):
            target, start, term = rec.who.pid, rec.who.starttime, rec.term
            what = f"no heartbeat for {fencing.mono() - rec.mono:.2f} s"
        elif holders:
            if not watch.holder_stale(holders[0], now):
                return False
            target, start, term = holders[0], None, rec.term + 1
            what = f"it has held the lock for {self.hung_timeout:g} s without a heartbeat"
        else:
            raise FenceRefused("no process visible on this host holds the state-dir lock "
                               "(is it held from another host?)")
        with fencing.verified_pidfd(target, start, dev, ino) as pidfd:
            if beats.read_beat() != rec:
                return False  # it beat meanwhile: not hung after all
            # The mark first: should the kill not take, the primary still finds it fenced
            # before its next acknowledgement.
            reason = f"{what} (hung_timeout {self.hung_timeout:g} s), fenced by {self.advertise}"
            beats.write_fence(FenceMark(term, os.getpid(), time.time(), reason))
            fencing.kill(pidfd)
        self.fenced.append(f"pid {target} term {term}")
        logger.warning(
            "controller {}: fenced the primary {} (pid {}, term {}): {} (hung_timeout {:g} s); "
            "verified it holds the state-dir lock (inode {}) and sent SIGKILL; taking the lock "
            "when the kernel releases it", self.advertise, rec.address, target, term, what,
            self.hung_timeout, ino)
        return True

    def abandon(self) -> None:
        """Make :meth:`wait` return False once it wakes (a blocked flock cannot be interrupted)."""
        self._abandoned.set()

    def publish(self) -> None:
        """Write this candidate's address as the primary's, atomically (rename; no fsync: the
        file is advice for redirects, rewritten at every promotion, and fsync costs ms).

        Best effort: on a full disk the standbys keep naming the old address, and clients
        still find this primary by walking the candidates.
        """
        self._takeover = None  # promoting: clients now hear "primary" from this candidate
        tmp = self.state_dir / f".primary.{os.getpid()}.{threading.get_ident()}"
        try:
            tmp.write_text(self.advertise + "\n")
            os.replace(tmp, self.primary_path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            logger.warning("controller {}: cannot publish the primary's address in {} ({}); "
                           "standbys will redirect to a stale address until it can",
                           self.advertise, self.primary_path, exc)

    def current_primary(self) -> str | None:
        """The advertised primary, or None when none is advertised."""
        try:
            text = self.primary_path.read_text().strip()
        except OSError:
            return None
        return text or None

    def register(self, state: str) -> None:
        """Record this candidate (address, pid, state) in ``candidates/``."""
        path = self.state_dir / "candidates" / (_safe_name(self.advertise) + ".json")
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        body = {"address": self.advertise, "pid": os.getpid(), "state": state, "since": time.time()}
        try:
            tmp.write_bytes(orjson.dumps(body))
            os.replace(tmp, path)
        except OSError as exc:  # a full disk: status lists this candidate less exactly
            with contextlib.suppress(OSError):
                tmp.unlink()
            logger.warning("controller {}: cannot register as {} in {} ({})",
                           self.advertise, state, path.parent, exc)

    def candidates(self) -> list[dict[str, Any]]:
        """Registered candidates whose process is alive (pids are only meaningful locally)."""
        out: list[dict[str, Any]] = []
        for path in sorted((self.state_dir / "candidates").glob("*.json")):
            try:
                entry = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(entry, dict) and pid_alive(int(entry.get("pid", 0)) or -1):
                out.append(entry)
        return out

    def release(self) -> None:
        """Withdraw the address (if it is ours), unregister, and drop the lock."""
        if self._held and self.current_primary() == self.advertise:
            with contextlib.suppress(OSError):
                self.primary_path.write_text("")
        with contextlib.suppress(OSError):
            (self.state_dir / "candidates" / (_safe_name(self.advertise) + ".json")).unlink()
        self._abandoned.set()
        self._takeover = None
        with self._mutex:
            # A thread still blocked in wait() owns the descriptor; it closes it on waking.
            if self._fd is not None and not self._waiting:
                if self._held:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
            self._held = False
            if self._beats is not None and not self._waiting:
                self._beats.close()
                self._beats = None
