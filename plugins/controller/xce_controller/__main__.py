"""``python -m xce_controller``: run one controller candidate without the ``xce`` command.

    python -m xce_controller --listen 127.0.0.1:7601 --state-dir /srv/xce [--key-file F | --auth munge]

SIGTERM or SIGINT stops it cleanly (pending writes are committed, the lock is released).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import anyio
from loguru import logger

from xce_controller.plugin import heap_on_huge_pages, tune_memory
from xce_controller.settings import SECTION, config_of, settings_from_config
from xcecore import auth
from xcecore.config import EVENT_LOOPS
from xcecore.runtime import loop_options

PROFILE_ENV = "XCE_CONTROLLER_PROFILE"
"""Set to a path prefix: the candidate dumps a cProfile of its event loop to ``PREFIX.<pid>``
when it stops cleanly (SIGTERM/SIGINT); for finding where a request's time goes."""

_DEFAULTS = {k: f.default for k, f in SECTION.fields.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m xce_controller", description=__doc__.splitlines()[0])
    p.add_argument("--listen", default=_DEFAULTS["listen"], help="host:port (port 0: any free port)")
    p.add_argument("--advertise", default=None, help="address clients are redirected to")
    p.add_argument("--state-dir", required=True, help="state directory shared by the candidates")
    p.add_argument("--auth", default="key", help="authentication method (as [cluster] auth)")
    p.add_argument("--munge-socket", default=None, help="munged's socket (as [cluster] munge_socket)")
    p.add_argument("--key", default=None, help="cluster key of --auth key (prefer --key-file)")
    p.add_argument("--key-file", default=None, help="file holding the cluster key")
    p.add_argument("--service-users", default="", help="comma-separated service user names")
    p.add_argument("--admins", default="", help="comma-separated administrator user names")
    p.add_argument("--host-timeout", type=float, default=_DEFAULTS["host_timeout"])
    p.add_argument("--max-subscriber-queue", type=int, default=_DEFAULTS["max_subscriber_queue"])
    p.add_argument("--clean-period", type=float, default=_DEFAULTS["clean_period"],
                   help="seconds a finished job is kept before it is purged (0: forever)")
    p.add_argument("--max-inflight", type=int, default=None, help="as [controller] max_inflight")
    p.add_argument("--max-unsent-bytes", type=int, default=None,
                   help="as [controller] max_unsent_bytes")
    p.add_argument("--stall-timeout", type=float, default=None, help="as [controller] stall_timeout")
    p.add_argument("--frame-timeout", type=float, default=None, help="as [controller] frame_timeout")
    p.add_argument("--storage-retry", type=float, default=None, help="as [controller] storage_retry")
    p.add_argument("--peers", default=None, help="the candidate list, for status")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--event-loop", default="auto", choices=EVENT_LOOPS,
                   help="auto: uvloop when installed (as [cluster] event_loop)")
    return p.parse_args(argv)


async def _run(args: argparse.Namespace) -> None:
    cluster: dict[str, Any] = {"auth": args.auth, **({"peers": args.peers} if args.peers else {}),
                               "service_users": [u for u in args.service_users.split(",") if u]}
    for name, value in (("key", args.key), ("key_file", args.key_file),
                        ("munge_socket", args.munge_socket)):
        if value is not None:
            cluster[name] = value
    section = {
        "state_dir": args.state_dir,
        "listen": args.listen,
        "admins": [a for a in args.admins.split(",") if a],
        "host_timeout": args.host_timeout,
        "max_subscriber_queue": args.max_subscriber_queue,
        "clean_period": args.clean_period,
        **({"advertise": args.advertise} if args.advertise else {}),
        **{k: v for k, v in (("max_inflight", args.max_inflight),
                             ("max_unsent_bytes", args.max_unsent_bytes),
                             ("stall_timeout", args.stall_timeout),
                             ("frame_timeout", args.frame_timeout),
                             ("storage_retry", args.storage_retry)) if v is not None},
    }
    config = config_of(cluster, section)
    settings = settings_from_config(config, auth.load_method(auth.settings_from_cluster(config.cluster)))
    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    logger.info("controller: got signal {}; stopping", signal.Signals(signum).name)
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(on_signal)
        from xce_controller.server import serve  # here: main() may execute the process again

        await serve(settings)
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m xce_controller``."""
    args = parse_args(argv)
    if argv is None:  # the process's own command line: it can be executed again
        heap_on_huge_pages(args.state_dir)
    logger.remove()
    # diagnose=False: a traceback must not print the values of a request's variables (they may
    # be huge or nested too deep to print).
    logger.add(sys.stderr, level=args.log_level.upper(), diagnose=False)
    tune_memory()
    profile = os.environ.get(PROFILE_ENV)
    if not profile:
        anyio.run(_run, args, backend_options=loop_options(args.event_loop))
        return
    import cProfile

    prof = cProfile.Profile()  # the event-loop thread only (the writer thread is not seen)
    prof.enable()
    try:
        anyio.run(_run, args, backend_options=loop_options(args.event_loop))
    finally:
        prof.disable()
        prof.dump_stats(f"{profile}.{os.getpid()}")


if __name__ == "__main__":
    main()
