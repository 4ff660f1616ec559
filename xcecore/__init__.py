"""xce core: candidate lists, wire, auth, connection manager, hooks, plugins, config, runtime.

Nothing here names a role: roles are plugins (see ``xcecore.hookspecs``).
"""

from pathlib import Path as _Path

__version__ = (_Path(__file__).with_name("VERSION")).read_text().strip()
"""The version of xce and of every distribution in this repository: ``xcecore/VERSION``."""
