"""State a plugin keeps per client or per role context, found from either hook argument.

Hooks are module-level functions: ``xce_push`` names only the client, a monitor only the
role context. A plugin that needs its own object per client (a store fed by pushes, a view, a
process manager) keeps it in an :class:`Attached`, made on first use and dropped with its
owner (weak keys: an owner's id is never mistaken for a later object's).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Attached(Generic[T]):
    """One ``T`` per owner object, made by ``factory(owner)`` on first use; thread-safe."""

    def __init__(self, factory: Callable[[Any], T]) -> None:
        self._factory = factory
        self._items: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, owner: Any) -> T:
        """The owner's object, made now if it has none."""
        with self._lock:
            found = self._items.get(owner)
            if found is None:
                found = self._items[owner] = self._factory(owner)
            return found

    def find(self, owner: Any) -> T | None:
        """The owner's object if it has one (never makes one)."""
        with self._lock:
            return self._items.get(owner)

    def forget(self, owner: Any) -> None:
        """Drop the owner's object (when the role stops)."""
        with self._lock:
            self._items.pop(owner, None)
