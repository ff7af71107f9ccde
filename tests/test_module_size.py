"""No module of the package is past the size limit of docs/design.md: 520 code lines (docstrings,
comments and blank lines not counted). A module that grows past it is split along its seams."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "lightning_triage"
#: The limit (docs/design.md, "Habits the lint holds").
MAX_CODE_LINES = 520
#: ... and the lines on disk, docstrings and comments included (a module that passes the code
#: limit by moving its logic into prose is still too long to read).
MAX_DISK_LINES = 650
_LAYOUT = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER)


def code_lines(text: str) -> int:
    """The lines of ``text`` that hold code: not blank, not only a comment, not in a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in _LAYOUT:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docstrings)
    return len(lines)


def test_code_lines_leave_out_docstrings_comments_and_blank_lines() -> None:
    text = '"""Module\n\ndoc."""\n\n# a comment\nx = (1,\n     2)  # trailing\n\n\ndef f():\n' \
           '    """Doc."""\n    return """a\nstring"""\n'
    assert code_lines(text) == 5  # x = (1, / 2) / def f(): / return """a / string"""


def test_no_module_is_past_the_size_limit() -> None:
    sizes = {path.relative_to(SRC).as_posix(): code_lines(path.read_text(encoding="utf-8"))
             for path in sorted(SRC.rglob("*.py"))}
    assert len(sizes) > 50
    over = {name: n for name, n in sizes.items() if n > MAX_CODE_LINES}
    assert over == {}, (f"split these modules along their seams (limit {MAX_CODE_LINES} code "
                        f"lines, docs/design.md): {over}")
    disk = {path.relative_to(SRC).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in sorted(SRC.rglob("*.py"))}
    long = {name: n for name, n in disk.items() if n > MAX_DISK_LINES}
    assert long == {}, (f"split these modules along their seams (limit {MAX_DISK_LINES} lines on "
                        f"disk, docs/design.md): {long}")


def test_no_callback_imports_from_a_sibling_callback() -> None:
    """Helpers the callbacks share live in private modules (`callbacks/_shared.py`, `_args.py`,
    `base.py`...); only the bundle, the package's `__init__` and the list of checks import the
    checks' own modules."""
    callbacks = SRC / "callbacks"
    public = {p.stem for p in callbacks.glob("*.py") if not p.stem.startswith("_")} - {"base"}
    found = []
    for path in sorted(callbacks.glob("*.py")):
        if path.stem in ("triage", "__init__", "_checks"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.startswith("lightning_triage.callbacks.") \
                    and node.module.rsplit(".", 1)[1] in public:
                found.append((path.name, node.module))
    assert found == []
