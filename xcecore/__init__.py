"""xce core: candidate lists, wire, auth, connection manager, hooks, plugins, config, runtime.

Nothing here names a role: roles are plugins (see ``xcecore.hookspecs``).
"""

import os as _os

# Read with open(), not pathlib: every `xce` command imports this package, and pathlib costs a
# one-shot command ~3 ms of its start-up here.
with open(_os.path.join(_os.path.dirname(__file__), "VERSION"), encoding="utf-8") as _fh:
    __version__ = _fh.read().strip()
"""The version of xce and of every distribution in this repository: ``xcecore/VERSION``."""
