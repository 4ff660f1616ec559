"""The cached host views: the JSON joined from cached bytes equals building it per request,
and a push re-converts only the host records it replaced."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from apikit import load
from xce_apiserver import app as app_module
from xce_apiserver.app import HostSelector, raw_ok
from xce_apiserver.hosts import lsf_host
from xce_apiserver.store import Store

from xcecore.resreq.evaluator import Evaluator

pytestmark = pytest.mark.timeout(60)


def host(name: str, ncpus: int = 4, used: int = 0, state: str = "ok", **attrs: Any) -> dict[str, Any]:
    """A host record as the controller pushes it."""
    return {"name": name, "state": state, "available": state != "unavail",
            "closed": state == "closed", "comment": "", "max_slots": ncpus, "used_slots": used,
            "attrs": {"hname": name, "ncpus": ncpus, "maxmem": 8192, "type": "X86_64", **attrs},
            "resvals": {"r1m": 0.1 * ncpus, "mem": 4000.0 - ncpus}, "joined_at": 1.7e9}


def _selector(nhosts: int = 12) -> tuple[Store, HostSelector]:
    store = Store()
    hosts = [host(f"n{i}", ncpus=2 + i, resources=["gpu"] if i % 2 else []) for i in range(nhosts)]
    hosts += [host("down", state="unavail"), host("full", ncpus=2, used=2, model="a100")]
    load(store, {"cluster": {"name": "t", "resources": [{"name": "gpu", "type": "bool"}]},
                 "hosts": hosts})
    return store, HostSelector(store, Evaluator)


def _expected_select(store: Store, sel: HostSelector, req: str, limit: int | None,
                     ntasks: int) -> list[dict[str, Any]]:
    """What the route answered before views were cached: per-request dicts, serialized."""
    views = {h["name"]: lsf_host(h) for h in store.snapshot_hosts()[1]}
    found = sel.evaluator().select(req, sel.views().mappings, limit=limit, ntasks=ntasks)
    items = [{**views[m.name], "tasks": m.tasks, "alternative": m.alternative} for m in found]
    return list(orjson.loads(orjson.dumps(items)))


@pytest.mark.parametrize(("req", "limit", "ntasks"), [
    ("select[ncpus>=3] order[ncpus]", None, 1),
    ("order[-r1m]", 3, 1),
    ("order[r1m] rusage[mem=100 || swp=1]", None, 5),
    ("select[ncpus>=3] span[hosts=1]", None, 4),
    ("select[ncpus>=100]", None, 1),
    ("status==ok", 1, 200),  # cannot be placed: no hosts
])
def test_select_json_equals_the_per_request_build(req: str, limit: int | None, ntasks: int) -> None:
    store, sel = _selector()
    data, count = sel.select_json(req, limit, ntasks)
    expected = _expected_select(store, sel, req, limit, ntasks)
    assert orjson.loads(data) == expected and count == len(expected)


def test_hosts_json_equals_the_views_and_the_envelope_is_complete() -> None:
    store, sel = _selector()
    data, count = sel.hosts_json()
    expected = [lsf_host(h) for h in store.snapshot_hosts()[1]]
    assert orjson.loads(data) == orjson.loads(orjson.dumps(expected)) and count == len(expected)
    envelope = orjson.loads(raw_ok(data, count).body)
    assert envelope == {"code": 200, "msg": "ok", "data": orjson.loads(data), "count": count}
    assert orjson.loads(HostSelector(Store(), Evaluator).hosts_json()[0]) == []


def test_a_push_reconverts_only_the_replaced_host(monkeypatch: pytest.MonkeyPatch) -> None:
    store, sel = _selector()
    first = sel.views()
    assert sel.views() is first  # unchanged hosts version: the same views, no rebuild
    converted: list[str] = []
    real = app_module.lsf_host

    def counting(record: dict[str, Any]) -> dict[str, Any]:
        converted.append(record["name"])
        return real(record)

    monkeypatch.setattr(app_module, "lsf_host", counting)
    store.apply("resvals", {"host": "n3", "values": {"r1m": 9.5, "mem": 1.0}})
    second = sel.views()
    assert converted == ["n3"] and second is not first
    assert second.entries["n3"][1]["r1m"] == 9.5 and second.entries["n4"] is first.entries["n4"]
    data, _ = sel.select_json("order[-r1m]", 1, 1)  # largest r1m first
    assert [h["hostName"] for h in orjson.loads(data)] == ["n3"]
    assert orjson.loads(data)[0]["loadIndices"]["r1m"] == 9.5
