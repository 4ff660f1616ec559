"""xce core: candidate lists, wire, auth, connection manager, hooks, plugins, config, runtime.

Nothing here names a role: roles are plugins (see ``xcecore.hookspecs``).
"""

__version__ = "0.1.0"
