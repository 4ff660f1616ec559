"""xce's controller backend on etcd v3: a lease election with fencing, and the state in etcd.

``[controller] backend = "etcd"`` selects it; ``[etcd]`` configures it (:mod:`xce_etcd.settings`).
The pieces: :mod:`xce_etcd.client` (a thin client of etcd's JSON gateway),
:mod:`xce_etcd.election` (the lease, the leader key, the local deadline),
:mod:`xce_etcd.store` (guarded, group-committed transactions), :mod:`xce_etcd.plugin` (the
hooks), :mod:`xce_etcd.testing` (real etcd members for the tests and benchmarks). The
operator's side is in docs/operator.md, "The etcd backend".

Which client, and why our own
-----------------------------

What the backend needs: leases with keep-alive, transactions with compares, ranges, several
endpoints with failover, etcd 3.4 (Debian's ``etcd-server``), blocking calls from the
controller's threads (the election waits on a thread; the store's writer is a thread), and a
clear line between "certainly not applied" and "outcome unknown" for every write, because
the controller answers a client either way.

- ``aetcd`` 1.0 (gRPC, asyncio): complete (leases, txns, watches), but asyncio-only on an
  anyio code base whose callers here are threads, and it brings ``grpcio`` and ``protobuf``
  (tens of MB of native wheels) for a handful of calls. One endpoint per client.
- ``etcd3`` 0.12 (gRPC, blocking): the most used, but its last release is from 2020 and it
  pins protobuf 3 stubs that newer ``protobuf`` releases refuse to load; unmaintained.
- ``etcd3gw`` 2.7 (the JSON gateway, ``requests``): blocking and light, leases and txns and
  watches; but a single endpoint, ``requests`` (a second HTTP stack beside the project's
  httpx), and transport errors surface as its own generic exceptions, without telling a
  request that was never sent (safe to retry elsewhere) from one sent without an answer.
- Our own over the JSON gateway with httpx (already a dependency of the project), about 250
  lines: exactly the calls above, the gateway paths 3.4 serves (``/v3/kv/...``,
  ``/v3/lease/...``, ``/v3/maintenance/status``), several endpoints (a request that could
  not connect moves on to the next one; one that was sent and not answered raises
  :class:`~xce_etcd.client.OutcomeUnknown`), etcd's errors with their gRPC code, and a list
  of those etcd raises before proposing (the quota, the txn limits) that are certainly not
  applied. No watch stream yet: the election polls with its campaign (one request per 20 ms
  per waiting standby), and the standbys' watch of the state prefix comes with the
  controller's follow interface (docs/operator.md, "What is not done yet").

Chosen: our own. The cost of the gateway (JSON and base64 instead of protobuf, HTTP/1.1
keep-alive instead of one multiplexed HTTP/2 stream) is measured in
``benchmarks/bench_etcd.py`` against etcd alone.
"""
