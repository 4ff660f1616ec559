"""The protocol's typed schemas: one argument model per controller op, one set of limits.

Everything that comes into the cluster is checked against the types defined here: a request
frame on the wire (:mod:`xcecore.wire` applies the cheap generic bound of
:mod:`xcecore.schema.limits` to every request, then the controller validates the op's
arguments against :data:`xcecore.schema.ops.OP_ARGS`), and a REST body (the API server's
request models are built from the same constrained types of :mod:`xcecore.schema.types`), so a
limit lives in one place and both edges enforce literally the same object.
``docs/protocol-ops.md`` is generated from these modules (``docs/gen_protocol_ops.py``).

Why pydantic v2 rather than msgspec: both validate in native code and both can express
lengths, ranges and patterns. pydantic is already a dependency (FastAPI is built on it, so
the REST models *are* pydantic models and can reuse these types as they are, with their
OpenAPI schema for free), its validators compose with ``Annotated`` (the recursive bounded
JSON value and the worker's join attributes need a little Python), and its errors carry a
location path and the violated constraint, which is what an ``INVALID`` reply must name.
msgspec would be faster on decode-plus-validate of whole frames, but the frame is already
decoded by orjson (the wire's codec), msgspec's constraints cannot be shared with FastAPI's
models, and it would be a second schema language beside the one the REST edge must speak.
Validation of typical arguments costs about a microsecond here (measured in
``benchmarks/bench_hotpaths.py``); an op with no arguments skips it.

Importing this package is free: :mod:`~xcecore.schema.limits` is plain Python (the wire and
the one-shot commands use it); only :mod:`~xcecore.schema.types` and
:mod:`~xcecore.schema.ops` import pydantic.
"""
