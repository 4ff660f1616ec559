"""A controller candidate whose event loop is made busy, blocked or deadlocked on command.

Started by ``test_ctl_busy_beat.py`` as a real process (the candidate is the production
:func:`xce_controller.server.serve`, on the production event loop choice)::

    python loop_faults.py STATE_DIR PORT

It prints ``ready`` once it listens, then reads commands on stdin, one a line:

- ``busy S``: one loop pass of S seconds of ready callbacks, each 1 ms of CPU that serves
  (marks the server's progress, as a handshake, a request or a writer's wake-up does): what a
  join storm of thousands of workers looks like to the loop. No timer fires inside the pass.
  Prints ``busy done`` when the pass is over.
- ``block S``: one callback blocks the loop for S seconds (``time.sleep``).
- ``deadlock``: one callback takes a lock the loop already holds: it never returns.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ctl_testlib import settings
from xce_controller.server import Controller, serve

from xcecore.runtime import loop_options


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def busy(ctl: Controller, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    def work() -> None:
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            pass
        ctl._progress()

    for _ in range(int(seconds * 1000)):
        loop.call_soon(work)
    loop.call_soon(say, "busy done")  # after the flood, in the same pass


def deadlock() -> None:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never returns: the loop's thread waits on itself


def commands(ctl: Controller, loop: asyncio.AbstractEventLoop) -> None:
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "busy":
            loop.call_soon_threadsafe(busy, ctl, loop, float(arg))
        elif cmd == "block":
            loop.call_soon_threadsafe(time.sleep, float(arg))
        elif cmd == "deadlock":
            loop.call_soon_threadsafe(deadlock)
        else:
            say(f"unknown command {cmd!r}")


async def main(state_dir: str, port: int) -> None:
    async with anyio.create_task_group() as tg:
        ctl: Controller = await tg.start(serve, settings(Path(state_dir), listen=f"127.0.0.1:{port}"))
        await ctl.promoted.wait()
        loop = asyncio.get_running_loop()
        threading.Thread(target=commands, args=(ctl, loop), daemon=True).start()
        say("ready")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), backend_options=loop_options("auto"))
