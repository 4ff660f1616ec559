"""Errors raised for bad resource requirements, with positions and a caret snippet.

Every problem a user can cause is a :class:`ResreqError` carrying a stable ``code`` (so
clients can branch on it), the offending section, and the 0-based offset and length of the
span in the *original* string, so the message can point at it.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "BAD_VALUE",
    "CHAINED_COMPARISON",
    "DUPLICATE_SECTION",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_NODES",
    "SYNTAX",
    "TOO_DEEP",
    "TOO_LONG",
    "TOO_MANY_NODES",
    "TYPE_MISMATCH",
    "UNBALANCED",
    "UNKNOWN_RESOURCE",
    "UNKNOWN_SECTION",
    "UNSUPPORTED_SECTION",
    "ResreqError",
    "make_snippet",
]

# Stable error codes: part of the public contract (API clients match on them).
SYNTAX: Final = "SYNTAX"
UNBALANCED: Final = "UNBALANCED"
UNKNOWN_RESOURCE: Final = "UNKNOWN_RESOURCE"
UNKNOWN_SECTION: Final = "UNKNOWN_SECTION"
DUPLICATE_SECTION: Final = "DUPLICATE_SECTION"
UNSUPPORTED_SECTION: Final = "UNSUPPORTED_SECTION"
CHAINED_COMPARISON: Final = "CHAINED_COMPARISON"
TYPE_MISMATCH: Final = "TYPE_MISMATCH"
TOO_LONG: Final = "TOO_LONG"
TOO_DEEP: Final = "TOO_DEEP"
TOO_MANY_NODES: Final = "TOO_MANY_NODES"
BAD_VALUE: Final = "BAD_VALUE"

# Limits, checked before anything recursive runs (see RESREQ.md "Errors").
MAX_LENGTH: Final = 8 * 1024
"""Longest accepted requirement, in characters."""
MAX_DEPTH: Final = 64
"""Deepest accepted nesting: brackets, parentheses, and syntax-tree levels."""
MAX_NODES: Final = 1000
"""Most syntax-tree nodes (expression nodes plus section items) in one requirement."""

# Snippets of very long lines are cut to a window around the span so an error message
# stays readable (and small) even for an 8 KiB requirement.
_WINDOW: Final = 100


def make_snippet(text: str, offset: int, length: int) -> tuple[str, int]:
    """Return ``(snippet, column)`` for the span ``text[offset:offset+length]``.

    The snippet is the line holding ``offset`` (tabs shown as spaces so the caret lines up,
    cut to a window when long) followed by a caret line under the span. ``column`` is the
    1-based column of ``offset`` within its line.
    """
    offset = max(0, min(offset, len(text)))
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    if end < 0:
        end = len(text)
    line = text[start:end].replace("\t", " ").replace("\r", " ")
    col = offset - start
    width = max(1, min(length, max(1, len(line) - col)))
    prefix = ""
    if len(line) > _WINDOW:
        # Keep the span visible: start the window a little before it.
        lo = max(0, col - _WINDOW // 4)
        hi = min(len(line), lo + _WINDOW)
        prefix = "..." if lo > 0 else ""
        suffix = "..." if hi < len(line) else ""
        shown_col = len(prefix) + col - lo
        width = max(1, min(width, hi - col))
        line = prefix + line[lo:hi] + suffix
    else:
        shown_col = col
    return f"{line}\n{' ' * shown_col}{'^' * width}", col + 1


class ResreqError(ValueError):
    """A resource requirement is invalid; says what, where, and with which stable code.

    ``str(err)`` is the message, a newline, and the snippet (the offending line with a caret
    line under the span).
    """

    code: str
    message: str
    section: str | None
    offset: int
    column: int
    length: int
    text: str
    snippet: str
    suggestion: str | None

    def __init__(
        self,
        code: str,
        message: str,
        *,
        text: str,
        offset: int,
        length: int = 1,
        section: str | None = None,
        suggestion: str | None = None,
    ) -> None:
        """Build the error for the span ``text[offset:offset+length]``."""
        self.code = code
        self.message = message
        self.section = section
        self.offset = max(0, min(offset, len(text)))
        self.length = max(1, length)
        self.text = text
        self.suggestion = suggestion
        self.snippet, self.column = make_snippet(text, self.offset, self.length)
        super().__init__(f"{message}\n{self.snippet}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description of the error (all attributes)."""
        return {
            "code": self.code,
            "message": self.message,
            "section": self.section,
            "offset": self.offset,
            "column": self.column,
            "length": self.length,
            "text": self.text,
            "snippet": self.snippet,
            "suggestion": self.suggestion,
        }

    def __reduce__(self) -> Any:
        # Exceptions with keyword-only constructors do not pickle by default; errors cross
        # process boundaries (workers, API), so make them round-trip.
        return (_rebuild, (self.to_dict(),))


def _rebuild(d: dict[str, Any]) -> ResreqError:
    """Recreate a pickled :class:`ResreqError`."""
    return ResreqError(
        d["code"],
        d["message"],
        text=d["text"],
        offset=d["offset"],
        length=d["length"],
        section=d["section"],
        suggestion=d["suggestion"],
    )
