"""Network namespaces from Python: run a thread, or a block of code, inside a named one.

A network namespace belongs to a thread, not a process (``setns(2)`` with ``CLONE_NEWNET``),
and a thread created by a thread that has entered one starts in it. A socket stays in the
namespace it was created in. So a test can make sockets in a simulated host's namespace from
its own process: enter, create (connect), leave. The fault test bed (:mod:`faultbed`) names
its namespaces under ``/run/netns`` as ``ip netns`` does.

Linux only, and root (``CAP_SYS_ADMIN``) only.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000

_T = TypeVar("_T")
_libc: ctypes.CDLL | None = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


def path_of(name: str) -> str:
    """The file that names namespace ``name`` (``/run/netns/NAME``)."""
    return os.path.join(NETNS_DIR, name)


def inode_of(name: str) -> int:
    """The namespace's inode: what ``/proc/PID/ns/net`` of its processes points at."""
    return os.stat(path_of(name)).st_ino


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the block with this thread in namespace ``name``; back where it was afterwards.

    Sockets (and threads) created inside the block stay in ``name`` for good.
    """
    mine = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(path_of(name), os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(mine)
    finally:
        os.close(mine)


def call_in(name: str, fn: Callable[..., _T], *args: Any, timeout: float | None = None) -> _T:
    """Run ``fn(*args)`` on a new thread that lives in namespace ``name``; its result.

    For whole event loops (``anyio.run``): the loop's worker threads start in the namespace
    too. The calling thread never changes namespace.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            target = os.open(path_of(name), os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            box["result"] = fn(*args)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{fn!r} in network namespace {name} did not finish in {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]
