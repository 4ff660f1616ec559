"""The worker role's object (:class:`WorkerRole`) and one running worker's parts (:class:`Worker`).

The role object exists before the worker connects: it answers the join attributes and queues
the pushes that arrive right after the join. Its parts (journal, process manager, monitors,
push handler, notifier) are built when the runtime asks for the monitors, right after the
first join and before main; building them opens the journal and re-adopts the jobs a previous
run of this worker left behind (and their tasks) before any push is handled, so a job is never started twice.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
from loguru import logger

from xce_worker.attrs import gpus, host_view, join_attributes
from xce_worker.containment import ContainConfig, instance_of, select
from xce_worker.hookspecs import containments
from xce_worker.monitors import ResvalBoard, hardware_monitor, jobs_monitor, system_monitor
from xce_worker.notifier import Notifier
from xce_worker.procman import ProcessManager
from xce_worker.pushes import SUBSCRIPTION, PushHandler, PushInbox
from xce_worker.settings import WorkerSettings, check_root_jobs
from xce_worker.spool import Journal
from xcecore.role import Handled, Monitor, Role, RoleContext

HARDWARE_EVERY = 12  # hardware facts are re-read every 12 monitor intervals
# Reports of different jobs in flight at once (each job's own reports still go in order): a
# finish report then never queues behind other jobs' round trips to the controller.
REPORT_LANES = 8


class Worker:
    """The parts of one worker and the threads that run them."""

    def __init__(self, ctx: RoleContext, inbox: PushInbox) -> None:
        self.ctx = ctx
        self.inbox = inbox
        self.settings = s = WorkerSettings.from_section(ctx.section)
        s.state_dir.mkdir(parents=True, exist_ok=True)
        post = ctx.client.post_latest if ctx.client is not None else None
        self.journal = Journal(s.state_dir / "journal.jsonl")
        containment = select(containments(ctx.pm.hook), s.containment,
                             ContainConfig(s.hname, s.cgroup_parent, s.freezer,
                                           instance_of(s.state_dir)))
        # Where this worker's job groups are, for operators (and for tests to clean up).
        (s.state_dir / "cgroups").write_text("".join(f"{b}\n" for b in containment.bases()))
        ngpus = len(gpus())
        logger.info("worker {}: job containment {}; {} core(s) to bind{}", s.hname,
                    containment.describe(), len(containment.cpus()) if s.bind_cores else "no",
                    f", {ngpus} GPU(s)" if ngpus else "")
        self.procman = ProcessManager(s.hname, self.journal, s.state_dir,
                                      kill_grace=s.kill_grace, post=post,
                                      run_as_user=s.run_as_user, containment=containment,
                                      bind_cores=s.bind_cores, gpus=ngpus,
                                      allow_root_jobs=s.allow_root_jobs)
        self.board = ResvalBoard(post, s.state_dir)
        self.pushes = PushHandler(s.hname, self.procman)
        # ctx.call gives up (ClientClosed) once the worker stops, so a report waiting through an
        # outage never holds the worker's shutdown; the report stays spooled for the next start.
        self.notifier = Notifier(s.hname, self.journal, ctx.call, lanes=REPORT_LANES)
        logger.info("worker {}: state dir {}; {} spooled report(s), {} job(s) from a previous "
                    "run", s.hname, s.state_dir, len(self.journal.pending()),
                    len(self.journal.active()))
        # Tasks first: the jobs' re-adoption removes every group that nothing re-adopted.
        self.procman.adopt(keep=self.pushes.tasks.adopt())
        self.last_answer = time.monotonic()  # the join was the last answer (metrics)

    def monitors(self) -> list[Monitor]:
        """Every thread of the worker, as monitors the runtime starts and stops."""
        s, section = self.settings, self.ctx.section
        return [
            # The hardware facts, with the configured values in place of what psutil sees: a
            # configured ncpus = 16 must hold for matching as it does for the join.
            Monitor("hardware", lambda stop: hardware_monitor(
                self.board, s.hname, s.monitor_interval * HARDWARE_EVERY, stop,
                facts=lambda: host_view(section))),
            Monitor("system", lambda stop: system_monitor(
                self.board, s.hname, s.monitor_interval, stop)),
            Monitor("jobs", lambda stop: jobs_monitor(
                self.procman, s.hname, s.monitor_interval, stop, self.pushes.tasks.sample)),
            Monitor("pushes", lambda stop: self.pushes.run(self.inbox, stop)),
            Monitor("notifier", lambda stop: self.notifier.run(stop)),
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
                self.last_answer = time.monotonic()
                if failing:
                    logger.info("worker {}: liveness probe answered again by {}", hname,
                                client.candidate)
                failing = False
            except Exception as exc:  # RemoteError, BackendUnavailable...: all the same here
                failing = True
                logger.warning("worker {}: liveness probe failed ({}); next in {:g} s", hname,
                               exc, interval)
            with anyio.move_on_after(interval):  # the next probe, or stop at once when told
                await self.ctx.stop.wait_async()

    def shutdown(self) -> None:
        """Stop (blocking): jobs stay running unless configured, undelivered reports stay
        spooled; both are logged."""
        s = self.settings
        self.pushes.tasks.shutdown(s.keep_jobs_on_shutdown, timeout=s.kill_grace + 5)
        self.procman.shutdown(keep_jobs=s.keep_jobs_on_shutdown)
        left = len(self.journal.pending())
        logger.info("worker {}: stopped; {} running job(s) {}; {} report(s) spooled in {}",
                    s.hname, len(self.procman.running),
                    "left running" if s.keep_jobs_on_shutdown else "not stopped in time",
                    left, self.journal.path)


class WorkerRole(Role):
    """The worker daemon of one host (``xce run worker``)."""

    rejoin_points = frozenset({"hello"})
    subscription = SUBSCRIPTION

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        check_root_jobs(WorkerSettings.from_section(ctx.section), ctx.auth.name, os.geteuid())
        self.inbox = PushInbox()
        self._worker: Worker | None = None

    def join_attributes(self) -> dict[str, Any]:
        """The host's attributes (``hname``, ``max_slots``, ncpus, maxmem, resources...)."""
        return join_attributes(self.ctx.section)

    def push(self, event: str, seq: int, data: Any) -> Handled:
        """Queue the push for the worker's ``pushes`` thread (never blocks the event loop)."""
        self.inbox.put((event, seq, data))
        return None

    @property
    def worker(self) -> Worker:
        """The worker's parts, built on first use (the runtime asks for monitors first)."""
        if self._worker is None:
            self._worker = Worker(self.ctx, self.inbox)
        return self._worker

    def monitors(self) -> list[Monitor]:
        """Hardware, system, job-usage, push and report-delivery loops, each on its own thread."""
        return self.worker.monitors()

    def metrics(self) -> list[Any]:
        """``xce_worker_*``: jobs running, reports not yet delivered, the controller's last answer."""
        from prometheus_client.core import GaugeMetricFamily

        if self._worker is None:
            return []
        w = self._worker
        out = []
        for name, value, what in (
                ("jobs_running", len(w.procman.running), "jobs this worker runs now"),
                ("reports_unsent", w.journal.pending_count(), "job reports spooled, not yet "
                 "acknowledged by the controller"),
                ("controller_answer_age_seconds", time.monotonic() - w.last_answer,
                 "seconds since the controller last answered the liveness probe")):
            g = GaugeMetricFamily(f"xce_worker_{name}", what, labels=["host"])
            g.add_metric([w.settings.hname], float(value))
            out.append(g)
        return out

    async def main(self) -> None:
        """Run until told to stop: the liveness probe, then a graceful stop."""
        import faulthandler
        import signal

        # `kill -USR1 <worker pid>` prints every thread's stack to stderr: for a hung worker.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        worker = self.worker
        try:
            await worker.liveness()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(worker.shutdown)

