"""The report's JSON Schema and the one validator every reader of a report goes through.

The schema, ``lightning-triage/report/1``, ships in the package as ``report_schema.json``
(:data:`REPORT_SCHEMA`; any JSON Schema draft 2020-12 validator accepts it). The validator here
is a small one over the keywords that schema uses, written out so that the command line stays
fast (no ``jsonschema`` import, linear in the report's size); a test checks it agrees with
``jsonschema``. Beyond the schema it rejects NaN and infinities where numbers are expected (JSON
has none), nesting deeper than :data:`MAX_DEPTH` and a ``start_here`` that names no finding.

Example:
    >>> from lightning_triage.errors import TriageReportError
    >>> try:
    ...     validate_report({"schema": "lightning-triage/report/1", "status": "done"}, "r.json")
    ... except TriageReportError as err:
    ...     print(err)
    r.json: not a valid lightning-triage report: (top level): missing key 'start_here'
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from lightning_triage.errors import TriageReportError

SCHEMA_ID = "lightning-triage/report/1"
#: The deepest nesting of lists and objects a report may have (the library writes < 12).
MAX_DEPTH = 100
#: The JSON Schema keywords :func:`validate_report` understands (annotations aside).
KEYWORDS = frozenset({"type", "enum", "const", "required", "properties", "additionalProperties",
                      "items", "prefixItems", "minItems", "maxItems", "minimum", "maxLength",
                      "pattern"})
ANNOTATIONS = frozenset({"$schema", "title", "description"})


def _load_schema() -> dict[str, Any]:
    text = resources.files("lightning_triage.report").joinpath("report_schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


#: JSON Schema (draft 2020-12) of the report, read from ``report_schema.json`` in the package.
REPORT_SCHEMA: dict[str, Any] = _load_schema()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": _is_int,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_KEY = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")


class _InvalidError(Exception):
    def __init__(self, path: str, what: str) -> None:
        super().__init__(path, what)
        self.path, self.what = path, what


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` on one line, cut to about ``limit`` characters."""
    if isinstance(value, (dict, list)):
        return f"{type(value).__name__} of {len(value)}"
    if _is_int(value) and value.bit_length() > 200:
        return f"an integer of {len(str(value)) if value.bit_length() < 14000 else 'many'} digits"
    text = repr(value if not isinstance(value, str) else value[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    if _KEY.match(text) and len(text) <= 60:
        return f"{path}.{text}" if path else text
    return f"{path}[{shown(text)}]"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return "non-finite number"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


@functools.lru_cache(maxsize=64)
def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """A JSON Schema ``pattern`` (ECMA-262) as Python reads it the same way: ``$`` outside a
    character class (and not escaped) ends the input, as in ECMA-262 without the multiline
    flag, where Python's ``$`` also matches before a final newline (``"data.x\\n"`` would
    pass ``^[a-z_]+\\.[a-z_0-9]+$``).

    Example:
        >>> bool(ecma_pattern(r"^[a-z]+$").search("abc\\n")), bool(ecma_pattern("^[$]$").search("$"))
        (False, True)
    """
    out, escaped, in_class = [], False, False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        elif char == "$" and not in_class:
            out.append("\\Z")
            continue
        out.append(char)
    return re.compile("".join(out))


def _scalar(value: Any, schema: Mapping[str, Any], path: str) -> None:
    if "const" in schema and value != schema["const"]:
        raise _InvalidError(path, f"expected {schema['const']!r}, got {shown(value)}")
    if "enum" in schema and (isinstance(value, (dict, list)) or value not in schema["enum"]):
        allowed = ", ".join(str(e) for e in schema["enum"])
        raise _InvalidError(path, f"{shown(value)} is not one of: {allowed}")
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in names):
            raise _InvalidError(path, f"expected {' or '.join(names)}, got {_type_name(value)} "
                                 f"{shown(value)}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise _InvalidError(path, f"longer than {schema['maxLength']} characters ({len(value)})")
        if "pattern" in schema and not ecma_pattern(schema["pattern"]).search(value):
            raise _InvalidError(path, f"{shown(value)} does not match {schema['pattern']}")
    if _is_number(value) and "minimum" in schema and value < schema["minimum"]:
        raise _InvalidError(path, f"{shown(value)} is below the minimum {schema['minimum']}")


def _check(value: Any, schema: Mapping[str, Any], path: str) -> None:
    _scalar(value, schema, path)
    if isinstance(value, Mapping):
        for key in schema.get("required", ()):
            if key not in value:
                raise _InvalidError(path or "(top level)", f"missing key {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], _child(path, key))
            elif extra is False:
                raise _InvalidError(_child(path, key), "unexpected key")
            elif isinstance(extra, Mapping):
                _check(item, extra, _child(path, key))
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise _InvalidError(path, f"expected at least {schema['minItems']} items, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise _InvalidError(path, f"expected at most {schema['maxItems']} items, got {len(value)}")
        prefix = schema.get("prefixItems", ())
        for i, (item, sub) in enumerate(zip(value, prefix, strict=False)):
            _check(item, sub, _child(path, i))
        rest = schema.get("items")
        if rest is not None:
            for i in range(len(prefix), len(value)):
                _check(value[i], rest, _child(path, i))


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists/objects deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (Mapping, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (Mapping, list)))
    return False


def validate_report(report: Any, source: Any = None) -> None:
    """Check ``report`` against :data:`REPORT_SCHEMA` (and the limits above).

    Args:
        report: the parsed report.
        source: where it came from (a path), named in the error.

    Raises:
        TriageReportError: one line: the source, the place in the report and what is wrong.
    """
    prefix = f"{one_line(str(source))}: " if source is not None else ""
    if isinstance(report, Mapping) and (not isinstance(report.get("schema"), str)
                                        or report.get("schema") != SCHEMA_ID):
        raise TriageReportError(f"{prefix}not a lightning-triage report (schema is "
                                f"{shown(report.get('schema'))}, expected {SCHEMA_ID!r})")
    try:
        if _depth_exceeds(report, MAX_DEPTH):
            raise _InvalidError("(top level)", f"nested deeper than {MAX_DEPTH} levels")
        _check(report, REPORT_SCHEMA, "")
        first = report["start_here"]
        if first is not None and not any(f["code"] == first for f in report["findings"]):
            raise _InvalidError("start_here", f"{shown(first)} names no finding of the report")
    except _InvalidError as err:
        raise TriageReportError(f"{prefix}not a valid lightning-triage report: {err.path}: "
                                f"{err.what}") from None
    except (ValueError, TypeError, OverflowError, RecursionError, KeyError) as exc:
        # whatever else a hand-made value makes a check raise: still one line, still invalid
        raise TriageReportError(f"{prefix}not a valid lightning-triage report: "
                                f"{type(exc).__name__}: {one_line(str(exc))[:200]}") from None


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                      "\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]")


def one_line(text: str) -> str:
    """``text`` with control characters (newlines too), invisible format characters (bidi
    overrides, zero-width characters) and lone surrogates shown as escapes: safe on one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


__all__ = ["MAX_DEPTH", "REPORT_SCHEMA", "SCHEMA_ID", "one_line", "validate_report"]
