"""Making whatever a run holds safe to write and to show.

- :func:`json_safe` turns any value (the user's hyperparameters, exception messages, objects
  whose ``__repr__`` or ``__getattr__`` raise) into plain JSON values that every file format can
  encode: lone surrogates (undecodable bytes of a file name, as Python decodes them) become
  U+FFFD, integers no JSON reader holds become strings, strings are cut at
  :data:`MAX_STRING` characters, nesting at :data:`MAX_DEPTH`; it never raises, and counts what it changed
  so the report can say so (``notes``).
- :func:`terminal_text` is report text for a terminal: C0/C1 control characters and the
  invisible format characters (bidi overrides and isolates, zero-width characters) replaced by
  a space, so no text can move the cursor, reorder a line or hide part of it.
- :func:`visible` applies the same rule to every string of a report before the HTML and the
  Markdown are rendered (the newline and the tab kept): no output carries a control character,
  a bidi override or a lone surrogate, whatever the run's objects were named.

Example:
    >>> changes = SafeNotes()
    >>> json_safe({"path": "caf\\udce9", "n": 10 ** 400}, changes)["path"]
    'caf�'
    >>> changes.notes()[0]
    '1 string(s) held characters no file can encode (lone surrogates): replaced by U+FFFD'
    >>> terminal_text("abc\\u202edef")
    'abc def'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Strings longer than this are cut in the written report (the files otherwise hold every text in
#: full; a string of this size is no message).
MAX_STRING = 1 << 26
#: Lists and objects nested deeper than this are written as a string (cycles end here too).
MAX_DEPTH = 40
#: Integers beyond a float's range are written as strings: JSON readers hold numbers as doubles
#: (Python's reader refuses more than 4300 digits).
_INT_LIMIT = 2 ** 1023
#: Arrays and tensors of more elements are written as their ``str`` (numpy and torch summarize).
MAX_ELEMENTS = 4096
_SURROGATE = re.compile(r"[\ud800-\udfff]")
#: C0 and C1 controls, and the invisible format characters that change what a line shows:
#: the soft hyphen, Arabic letter mark, zero-width characters and joiners, the bidi marks,
#: embeddings, overrides and isolates, the word joiner and invisible operators, and the BOM.
TERMINAL_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff"
    "\ufff9-\ufffb]+")


#: What no output shows: the terminal-unsafe characters except the newline and the tab (which
#: an HTML page or a Markdown table cell lays out itself).
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\ufeff\ufff9-\ufffb]+")


@dataclass
class SafeNotes:
    """What :func:`json_safe` changed, counted by kind."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def notes(self) -> list[str]:
        """One sentence per kind of change."""
        out = []
        for kind, n in self.counts.items():
            out.append(f"{n} {_NOTE[kind]}")
        return out


_NOTE = {
    "surrogate": "string(s) held characters no file can encode (lone surrogates): replaced by "
                 "U+FFFD",
    "big_int": "integer(s) too large for a JSON number: written as strings",
    "long": f"string(s) longer than {MAX_STRING} characters: cut",
    "deep": f"value(s) nested deeper than {MAX_DEPTH} levels: written as a string",
    "unreadable": "value(s) could not be read (their methods raised): written as a placeholder",
    "key": "object key(s) that are not strings: written as strings",
}


def safe_str(value: str, notes: SafeNotes | None = None) -> str:
    """``value`` cut to :data:`MAX_STRING` characters, lone surrogates replaced by U+FFFD."""
    if len(value) > MAX_STRING:
        if notes is not None:
            notes.add("long")
        value = value[:MAX_STRING] + f"… ({len(value) - MAX_STRING} more characters)"
    if _SURROGATE.search(value):
        if notes is not None:
            notes.add("surrogate")
        value = _SURROGATE.sub("\ufffd", value)
    return value


def _type_name(value: Any) -> str:
    try:
        return str(type(value).__name__)[:100]
    except Exception:  # pragma: no cover - a metaclass whose __name__ raises
        return "object"


def describe(value: Any, notes: SafeNotes | None = None) -> str:
    """``str(value)`` made safe; a placeholder naming the type when ``str`` raises (or returns
    something that is not a string)."""
    try:
        text = str(value)
        if not isinstance(text, str):  # pragma: no cover - a str subclass returning odd types
            raise TypeError("__str__ returned a non-string")
        text = str.__str__(text)  # a str subclass is written as plain text
    except Exception:
        if notes is not None:
            notes.add("unreadable")
        return f"<unprintable {safe_str(_type_name(value))}>"
    return safe_str(text, notes)


def _big_int(value: int, notes: SafeNotes | None) -> str:
    if notes is not None:
        notes.add("big_int")
    digits = int(value.bit_length() * math.log10(2)) + 1
    if digits > 4000:
        return f"<an integer of about {digits} digits>"
    return str(value)


def _key(key: Any, notes: SafeNotes | None) -> str:
    if isinstance(key, str):
        return safe_str(str.__str__(key), notes)
    if notes is not None:
        notes.add("key")
    return describe(key, notes)


def json_safe(value: Any, notes: SafeNotes | None = None, depth: int = 0) -> Any:
    """``value`` as plain JSON values (``dict`` with string keys, ``list``, ``str``, ``int``,
    finite ``float``, ``bool``, ``None``) that every file format encodes. Never raises.

    A non-finite float becomes its name as a string (``"nan"``, ``"inf"``), as in findings'
    evidence; numpy and torch values become numbers or lists; any other object its ``str``.
    """
    try:
        if value is None or isinstance(value, bool):
            return bool(value) if value is not None else None
        if isinstance(value, str):
            return safe_str(str.__str__(value), notes)
        if isinstance(value, int):
            value = int(value)
            return value if -_INT_LIMIT < value < _INT_LIMIT else _big_int(value, notes)
        if isinstance(value, float):
            value = float(value)
            return value if math.isfinite(value) else str(value)
        if depth >= MAX_DEPTH and isinstance(value, (Mapping, list, tuple)):
            if notes is not None:
                notes.add("deep")
            return f"<{_type_name(value)} nested too deeply>"
        if isinstance(value, Mapping):
            return {_key(k, notes): json_safe(v, notes, depth + 1) for k, v in list(value.items())}
        if isinstance(value, (list, tuple)):
            return [json_safe(v, notes, depth + 1) for v in list(value)]
        if type(value).__module__.split(".")[0] in ("numpy", "torch"):
            size = value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)
            tolist = getattr(value, "tolist", None)
            if callable(tolist) and isinstance(size, int) and size <= MAX_ELEMENTS:
                return json_safe(tolist(), notes, depth + 1)
        return describe(value, notes)
    except Exception:  # a container whose iteration raises, a numpy value that cannot convert
        if notes is not None:
            notes.add("unreadable")
        return f"<unreadable {_type_name(value)}>"


def terminal_text(text: Any) -> str:
    """Report text for a terminal: control characters (escape sequences, newlines) and invisible
    format characters (bidi overrides, zero-width characters) replaced by a space, lone
    surrogates by U+FFFD. Never raises."""
    return TERMINAL_UNSAFE.sub(" ", describe(text) if not isinstance(text, str)
                               else safe_str(str.__str__(text)))


def visible_text(text: Any) -> str:
    """The one rule for user-derived text in a file meant to be read (HTML, Markdown): lone
    surrogates replaced by U+FFFD, control characters (but the newline and the tab) and the
    invisible format characters (bidi overrides and isolates, zero-width characters) replaced
    by a space; each renderer then escapes its own syntax. Never raises.

    Example:
        >>> visible_text("a\\x1b]0;title\\x07b\\u202ec\\nd\\udce9")
        'a ]0;title b c\\nd\\ufffd'
    """
    return _HIDDEN.sub(" ", describe(text) if not isinstance(text, str)
                       else safe_str(str.__str__(text)))


def visible(value: Any, depth: int = 0) -> Any:
    """``value`` (a report, or any part of it) with :func:`visible_text` applied to every
    string and object key; numbers, booleans and ``None`` as they are. Never raises."""
    if isinstance(value, str):
        return visible_text(value)
    if depth >= MAX_DEPTH:
        return value if not isinstance(value, (Mapping, list, tuple)) else describe(value)
    if isinstance(value, Mapping):
        return {visible_text(k): visible(v, depth + 1) for k, v in list(value.items())}
    if isinstance(value, (list, tuple)):
        return [visible(v, depth + 1) for v in value]
    return value


__all__ = ["MAX_DEPTH", "MAX_STRING", "SafeNotes", "describe", "json_safe", "safe_str",
           "terminal_text", "visible", "visible_text"]
