"""Regenerate the argument tables of docs/configuration.md from the real signatures and the
``Args:`` sections of the docstrings: python docs/make_config_reference.py

``tests/test_docs.py`` checks that the committed tables are what this script writes.
"""

from __future__ import annotations

import collections.abc
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import lightning_triage
from lightning_triage.callbacks import CHECKS

BEGIN, END = "<!-- config:begin -->", "<!-- config:end -->"
#: The bundle, the report, then every check in protocol order (``callbacks.CHECKS``).
CLASSES = ("Triage", "TriageReport", *(cls.__name__ for cls in CHECKS))


def type_name(hint: Any) -> str:
    """A short readable form of a resolved type hint (``Literal`` values spelled out)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return "None"
    if hint is Any:
        return "Any"
    if hint is Ellipsis:
        return "..."
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is collections.abc.Callable:
        params, ret = args
        inner = "..." if params is Ellipsis else ", ".join(type_name(p) for p in params)
        return f"Callable[[{inner}], {type_name(ret)}]"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def _markdown(text: str) -> str:
    """Docstring text as the text of a table cell: reST roles and double backticks become code
    spans; a pipe outside a code span is escaped (inside one it does not split the cell in
    Python-Markdown's tables, and a backslash there would show)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")  # :class:`X` -> `X`
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def summary(cls: type) -> str:
    """The first paragraph of the class docstring, on one line."""
    paragraph = (inspect.getdoc(cls) or "").split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def arg_docs(cls: type) -> dict[str, str]:
    """``{name: description}`` from the ``Args:`` section of the class docstring."""
    lines = (inspect.getdoc(cls) or "").splitlines()
    docs: dict[str, str] = {}
    try:
        start = lines.index("Args:")
    except ValueError:
        return docs
    name = None
    for line in lines[start + 1:]:
        if line.strip() and not line.startswith("    "):
            break  # the next section
        match = re.match(r"^    (\*{0,2}\w+)(?: \(.*\))?: ?(.*)$", line)
        if match:
            name = match.group(1).lstrip("*")
            docs[name] = match.group(2).strip()
        elif name and line.strip():
            docs[name] += " " + line.strip()
    return docs


def rows(cls: type) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, description)`` per argument of ``cls.__init__``."""
    hints = typing.get_type_hints(cls.__init__)
    docs = arg_docs(cls)
    out = []
    for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is param.empty:
            default = "required"
        elif isinstance(param.default, str):
            default = f'"{param.default}"'
        else:
            default = repr(param.default)
        out.append((param.name, type_name(hints.get(param.name, Any)), default,
                    docs.get(param.name, "")))
    return out


def tables() -> str:
    parts = []
    for name in CLASSES:
        cls = getattr(lightning_triage, name)
        lines = [f"### `{name}`", "", _markdown(summary(cls)), "",
                 "| argument | type | default | meaning |", "|---|---|---|---|"]
        for arg, kind, default, doc in rows(cls):
            # a pipe inside a code span does not split a cell (Python-Markdown's tables)
            lines.append(f"| `{arg}` | `{kind}` | `{default}` | {_markdown(doc)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


if __name__ == "__main__":
    path = Path(__file__).with_name("configuration.md")
    text = path.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    path.write_text(f"{head}{BEGIN}\n{tables()}\n{END}{tail}")
