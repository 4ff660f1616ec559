"""A site evaluator that wraps the built-in one and adds a derived resource.

``load_per_cpu`` is the host's one-minute run queue divided by its CPU count: the figure a
site's users actually want (``select[load_per_cpu < 0.5] order[load_per_cpu]``). It is
computed from what workers already report, so no worker changes.

It wraps rather than replaces: the language, errors and speed are the built-in evaluator's;
this plugin only fills in the value on each host. It is selected by configuration twice over:
it answers the hook (first, ``tryfirst``) only when the site declares the resource in
``[cluster] resources``, and ``[plugins] disable = ["site_resreq"]`` blocks it outright (the
name is then declared but never known, so nothing selects on it). Everywhere else the built-in
evaluator answers, untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xcecore.hookspecs import hookimpl

if TYPE_CHECKING:  # every `xce` command loads this module: the language loads when asked for
    from xcecore.resreq import CompiledReq, HostMatch, ResourceRegistry

NAME = "load_per_cpu"
DECLARATION = {"name": NAME, "type": "numeric", "increasing": False}
"""What a site puts in ``[cluster] resources`` to turn the evaluator on."""


def with_derived(host: Mapping[str, Any]) -> Mapping[str, Any]:
    """The host plus ``load_per_cpu`` when both inputs are known (else it stays unknown)."""
    r1m, ncpus = host.get("r1m"), host.get("ncpus")
    if isinstance(r1m, int | float) and isinstance(ncpus, int | float) and ncpus > 0:
        return {**host, NAME: r1m / ncpus}
    return host


class SiteReq:
    """A compiled requirement that sees hosts with the derived resource added."""

    def __init__(self, inner: CompiledReq) -> None:
        self.inner = inner
        self.text = inner.text

    def predicate(self, host: Mapping[str, Any]) -> bool:
        """Select section on the extended host."""
        return self.inner.predicate(with_derived(host))

    def sort_key(self, host: Mapping[str, Any]) -> tuple[Any, ...]:
        """Order key on the extended host."""
        return self.inner.sort_key(with_derived(host))

    def fit(self, host: Mapping[str, Any]) -> int | None:
        """Which rusage alternative fits the extended host."""
        return self.inner.fit(with_derived(host))

    def match(self, hosts: Sequence[Mapping[str, Any]], *, limit: int | None = None,
              ntasks: int = 1) -> list[HostMatch]:
        """Select, fit and order extended hosts."""
        return self.inner.match([with_derived(h) for h in hosts], limit=limit, ntasks=ntasks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # rusage, span, same, order...


class SiteEvaluator:
    """The built-in evaluator, over hosts that carry ``load_per_cpu``."""

    def __init__(self, registry: ResourceRegistry) -> None:
        from xcecore.resreq import Evaluator

        self.registry = registry
        self._inner = Evaluator(registry)

    def compile(self, text: str) -> SiteReq:
        """Compile with the built-in evaluator (and its cache)."""
        return SiteReq(self._inner.compile(text))

    def select(self, text: str, hosts: Sequence[Mapping[str, Any]], *, limit: int | None = None,
               ntasks: int = 1) -> list[HostMatch]:
        """Qualifying hosts in order, with the derived resource available."""
        return self.compile(text).match(hosts, limit=limit, ntasks=ntasks)


@hookimpl(tryfirst=True)
def xce_resreq_evaluator(registry: ResourceRegistry) -> SiteEvaluator | None:
    """Answer before the built-in plugin when the site declared the resource; else defer."""
    return SiteEvaluator(registry) if registry.get(NAME) is not None else None
