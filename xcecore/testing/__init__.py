"""Real clusters for tests, benchmarks and ``xce up``.

- :mod:`xcecore.testing.cluster`: :class:`LocalCluster`, a whole cluster of real processes on
  loopback, and the small helpers the suites share (``free_port``, ``wait_for``, ``probe``).
- :mod:`xcecore.testing.plugin`: the pytest plugin (``pytest11`` entry point) with the
  ``xce_cluster``, ``xce_client`` and ``xce_plugin_manager`` fixtures.

Importing this package imports neither pytest nor the client library.
"""

from xcecore.testing.cluster import DEFAULT_KEY, LocalCluster, Proc, free_port, probe, wait_for

__all__ = ["DEFAULT_KEY", "LocalCluster", "Proc", "free_port", "probe", "wait_for"]
