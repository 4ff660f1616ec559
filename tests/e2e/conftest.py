"""A whole cluster for the end-to-end suite: the same `Embedded` cluster `xce up` runs."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from xce_cli.up import Embedded


@pytest.fixture
def embedded(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Embedded]]:
    """Factory: ``embedded(candidates=3, workers=2)`` -> a started cluster; all stopped after."""
    made: list[Embedded] = []

    def make(candidates: int = 3, workers: int = 2) -> Embedded:
        emb = Embedded(tmp_path / f"emb{len(made)}", candidates, workers, 0)
        made.append(emb)
        emb.root.mkdir(parents=True, exist_ok=True)
        emb.start()
        return emb

    yield make
    rep = getattr(request.node, "rep_call", None)
    for emb in made:
        if rep is not None and rep.failed:
            sys.stderr.write(emb.cluster.logs())
        emb.close()
