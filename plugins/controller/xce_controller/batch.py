"""``jobdispatch_many``: many dispatches as one pure state change (one commit, one rid).

Each item goes through :meth:`ClusterState.dispatch` exactly as a ``jobdispatch`` would, in
the request's order, so each sees the state the items before it left; a refused item raised
before changing anything, so it is reported with its error and the rest go on. The items'
changes are merged, and a record several items touched (a host taking ten jobs, an array's
record) is written and pushed once, as it stands after the batch: the store gets one row per
record and each host's worker one push of its host per batch, not one per job.
"""

from __future__ import annotations

from typing import Any

from loguru import logger

from xce_controller.state import Changes, ClusterState
from xcecore.wire import ErrorCode, RemoteError


def dispatch_many(st: ClusterState, items: list[dict[str, Any]]) -> Changes:
    """Apply each item (``{"jobid", "alloc", "more"?}``, validated) on its own; the result
    says, per item in order, RUN or the refusal (code and message)."""
    out = Changes()
    results: list[dict[str, Any]] = []
    dispatched = 0
    for item in items:
        jobid = item["jobid"]
        try:
            ch = st.dispatch(jobid, item["alloc"], False, item.get("more"))
        except RemoteError as exc:
            results.append({"jobid": jobid, "code": str(exc.code), "message": exc.message})
            continue
        except Exception as exc:  # a defect: this item is refused, the batch goes on
            logger.opt(exception=True).error(
                "controller: jobdispatch_many: dispatching job {} failed unexpectedly; that "
                "item is answered INTERNAL, the others go on", jobid)
            results.append({"jobid": jobid, "code": str(ErrorCode.INTERNAL),
                            "message": f"{type(exc).__name__}: {exc}"})
            continue
        dispatched += 1
        out.rows.extend(ch.rows)
        out.events.extend(ch.events)
        entry: dict[str, Any] = {"jobid": jobid, "state": "RUN"}
        elements = ch.result.get("elements") if isinstance(ch.result, dict) else None
        if elements is not None:
            entry["elements"] = [{"jobid": e["jobid"], "index": e["index"]} for e in elements]
        results.append(entry)
    out.rows = _last_of_each(out.rows, {(row[0], row[1]): i for i, row in enumerate(out.rows)})
    # The same record pushed twice carries the same data object (it is encoded once, as it
    # stands at the end of the batch); events built per call (signals) never repeat.
    out.events = _last_of_each(out.events,
                               {(ev.name, id(ev.data)): i for i, ev in enumerate(out.events)})
    out.result = {"dispatched": dispatched, "refused": len(items) - dispatched,
                  "results": results}
    return out


def _last_of_each(seq: list[Any], last: dict[Any, int]) -> list[Any]:
    """``seq`` with only the last of the entries that share a key, in their order; ``last``
    maps each key to the index of its last entry (built inline by the caller: a key function
    called twice per entry was a tenth of a batch's cost)."""
    if len(last) == len(seq):
        return seq
    return [seq[i] for i in sorted(last.values())]
