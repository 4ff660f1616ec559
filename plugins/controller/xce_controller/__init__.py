"""xce controller role: primary/standby candidates, durable cluster state, ops and pushes.

The server core (:mod:`xce_controller.server`) takes :class:`~xce_controller.settings.
ControllerSettings` only; :mod:`xce_controller.plugin` adapts it to ``xce run controller``.
"""

__version__ = "0.1.0"
