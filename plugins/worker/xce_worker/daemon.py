"""One running worker: its journal, process manager, monitors, push handler and notifier.

Built once per role context, by whichever of ``xce_monitors`` or the role's main asks first
(the runtime asks for monitors right after the first join, before main). Building it opens
the journal and re-adopts the jobs a previous run of this worker left behind, before any
push is handled, so a job is never started twice.
"""

from __future__ import annotations

import anyio
from loguru import logger

from xce_worker.monitors import ResvalBoard, hardware_monitor, system_monitor
from xce_worker.notifier import Notifier
from xce_worker.procman import ProcessManager
from xce_worker.pushes import PushHandler, inbox_for
from xce_worker.settings import WorkerSettings
from xce_worker.spool import Journal
from xcecore.attached import Attached
from xcecore.records import Monitor
from xcecore.runtime import RoleContext

HARDWARE_EVERY = 12  # hardware facts are re-read every 12 monitor intervals
# Reports of different jobs in flight at once (each job's own reports still go in order): a
# finish report then never queues behind other jobs' round trips to the controller.
REPORT_LANES = 8


class Worker:
    """The parts of one worker and the threads that run them."""

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx
        self.settings = s = WorkerSettings.from_section(ctx.section)
        s.state_dir.mkdir(parents=True, exist_ok=True)
        post = ctx.client.post_latest if ctx.client is not None else None
        self.journal = Journal(s.state_dir / "journal.jsonl")
        self.procman = ProcessManager(s.hname, self.journal, s.state_dir,
                                      kill_grace=s.kill_grace, post=post,
                                      run_as_user=s.run_as_user)
        self.board = ResvalBoard(post, s.state_dir)
        self.pushes = PushHandler(s.hname, self.procman)
        # ctx.call gives up (ClientClosed) once the worker stops, so a report waiting through an
        # outage never holds the worker's shutdown; the report stays spooled for the next start.
        self.notifier = Notifier(s.hname, self.journal, ctx.call, lanes=REPORT_LANES)
        logger.info("worker {}: state dir {}; {} spooled report(s), {} job(s) from a previous "
                    "run", s.hname, s.state_dir, len(self.journal.pending()),
                    len(self.journal.active()))
        self.procman.adopt()

    def monitors(self) -> list[Monitor]:
        """Every thread of the worker, as monitors the runtime starts and stops."""
        s = self.settings
        inbox = inbox_for(self.ctx.client)
        return [
            Monitor("hardware", lambda ctx, stop: hardware_monitor(
                self.board, s.hname, s.monitor_interval * HARDWARE_EVERY, stop)),
            Monitor("system", lambda ctx, stop: system_monitor(
                self.board, s.hname, s.monitor_interval, stop)),
            Monitor("jobs", lambda ctx, stop: self.procman.usage_loop(s.monitor_interval, stop)),
            Monitor("pushes", lambda ctx, stop: self.pushes.run(inbox, stop)),
            Monitor("notifier", lambda ctx, stop: self.notifier.run(stop)),
        ]

    async def liveness(self) -> None:
        """``hello`` every ``hello_interval``: a cadence, and the worker's rejoin point.

        A failed or slow probe is logged and the next one follows; nothing here ever stops
        the worker: the client owns reconnecting, and re-joins after the next ``hello``.
        """
        client, interval, hname = self.ctx.client, self.settings.hello_interval, self.settings.hname
        assert client is not None
        failing = False
        while not self.ctx.stop.is_set():
            try:
                await client.call("hello", {})
                if failing:
                    logger.info("worker {}: liveness probe answered again by {}", hname,
                                client.candidate)
                failing = False
            except Exception as exc:  # RemoteError, BackendUnavailable...: all the same here
                failing = True
                logger.warning("worker {}: liveness probe failed ({}); next in {:g} s", hname,
                               exc, interval)
            await anyio.sleep(interval)

    def shutdown(self) -> None:
        """Stop (blocking): jobs stay running unless configured, undelivered reports stay
        spooled; both are logged."""
        s = self.settings
        self.procman.shutdown(keep_jobs=s.keep_jobs_on_shutdown)
        left = len(self.journal.pending())
        logger.info("worker {}: stopped; {} running job(s) {}; {} report(s) spooled in {}",
                    s.hname, len(self.procman.running),
                    "left running" if s.keep_jobs_on_shutdown else "not stopped in time",
                    left, self.journal.path)


worker_for: Attached[Worker] = Attached(Worker)
"""The worker of a role context, built on first use."""

