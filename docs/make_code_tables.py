"""Regenerate every table of stages and finding codes in the docs and the README from the registry
(``lightning_triage.findings``) and the checks' declarations (``lightning_triage.callbacks``),
and the one statement of where the documented measurements were taken (:data:`MEASURED`):
``python docs/make_code_tables.py``; ``--check`` only reports the stale files (exit status 1).

A generated block sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->`` in
any page of ``docs/`` or the README; NAME is one of :data:`BLOCKS` (``codes:<stage>`` for a
stage's codes). ``tests/test_docs.py`` fails when a block is stale.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from lightning_triage.callbacks import CHECKS
from lightning_triage.findings import CODES, STAGE_QUESTIONS, STAGES, CodeSpec, stage_index

ROOT = Path(__file__).resolve().parents[1]
#: Where each stage's codes are explained (thresholds, limits): the stage pages.
STAGE_PAGES = {
    "data": ["data.md"], "init": ["init.md"], "wiring": ["wiring.md"], "overfit": ["overfit.md"],
    "structure": ["structure.md"], "mode": ["mode.md"], "curve": ["curves.md", "long_run.md"],
    "grad": ["curves.md", "long_run.md"], "numerics": ["numerics.md"], "triage": ["findings.md"],
    "run": ["report.md"],
}
BLOCK = re.compile(r"(<!-- generated: ([\w:-]+) -->\n)(.*?)(<!-- end generated -->)", re.DOTALL)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _specs(stage: str | None = None) -> list[CodeSpec]:
    specs = sorted(CODES.values(), key=lambda s: (stage_index(s.stage), s.code))
    return [s for s in specs if stage is None or s.stage == stage]


def _checks(stage: str) -> str:
    return ", ".join(f"`{cls.__name__}`" for cls in CHECKS if cls.stage == stage)


def stage_table(links: str = "") -> str:
    """The protocol: one row per stage with its question and checks (``links``: a prefix for
    links to the stage pages; empty: no page column)."""
    head = "| # | stage | question it answers | checks |" + (" docs |" if links else "")
    rows = [head, "|---" * (5 if links else 4) + "|"]
    for i, stage in enumerate(STAGES, 1):
        row = f"| {i} | `{stage}` | {STAGE_QUESTIONS[stage]} | {_checks(stage)} |"
        if links:
            row += " " + ", ".join(f"[{p}]({links}{p})" for p in STAGE_PAGES[stage]) + " |"
        rows.append(row)
    return "\n".join(rows)


def code_table() -> str:
    """Every code with its severity, title and hint (docs/findings.md)."""
    rows = ["| code | severity | title | what to do |", "|---|---|---|---|"]
    rows += [f"| `{s.code}` | {s.severity} | {_cell(s.title)} | {_cell(s.hint)} |" for s in _specs()]
    return "\n".join(rows)


def stage_codes(stage: str) -> str:
    """One stage's codes with their severity and when they fire (the stage pages)."""
    rows = ["| code | severity | fires when |", "|---|---|---|"]
    rows += [f"| `{s.code}` | {s.severity} | {_cell(s.when)} |" for s in _specs(stage)]
    return "\n".join(rows)


def code_list() -> str:
    """The codes by stage, one row each (docs/design.md)."""
    rows = ["| stage | codes |", "|---|---|"]
    for stage in (*STAGES, "run", "triage"):
        rows.append(f"| `{stage}` | " + ", ".join(f"`{s.code}`" for s in _specs(stage)) + " |")
    return "\n".join(rows)


#: Where the numbers of the docs were measured: the one place that says it (the ``measured``
#: block of every page that reports timings). Edit here when a benchmark runs elsewhere.
MEASURED = (
    "**Where these numbers come from.** Every time and overhead in these pages was measured on "
    "CPU: a development machine of 2 cores shared with other jobs, 1 thread, torch 2.13.0, "
    "Lightning 2.6.6, each run with its date. A GPU (one H200) ran `benchmarks/gpu_check.py` "
    "once, for correctness only (healthy fits silent, the precision bugs caught: "
    "[benchmarks](benchmarks.md#on-a-gpu-silent-on-healthy-runs-the-precision-bugs-caught)); "
    "no GPU timing was taken, so the `deferred` mode's device buffers and the `sync` mode's "
    "host read per step are not measured."
)


def measured() -> str:
    """:data:`MEASURED`, wrapped at 100 columns."""
    import textwrap

    return textwrap.fill(MEASURED, width=100, break_on_hyphens=False, break_long_words=False)


BLOCKS: dict[str, Callable[[], str]] = {
    "measured": measured,
    "stages": stage_table,
    "stages:linked": lambda: stage_table(links="./"),
    "codes": code_table,
    "code-list": code_list,
    **{f"codes:{stage}": (lambda stage=stage: stage_codes(stage)) for stage in STAGE_PAGES},
}


def pages() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def regenerate(text: str) -> str:
    """``text`` with every generated block rewritten."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in BLOCKS:
            raise KeyError(f"unknown generated block {name!r}; known: {sorted(BLOCKS)}")
        return f"{match.group(1)}{BLOCKS[name]()}\n{match.group(4)}"

    return BLOCK.sub(fill, text)


def stale() -> list[Path]:
    """The pages whose generated blocks differ from what this script writes."""
    return [p for p in pages() if regenerate(p.read_text()) != p.read_text()]


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        out = stale()
        print("\n".join(f"stale: {p.relative_to(ROOT)}" for p in out) or "all generated blocks are current")
        sys.exit(1 if out else 0)
    for path in pages():
        text = path.read_text()
        if regenerate(text) != text:
            path.write_text(regenerate(text))
            print(f"wrote {path.relative_to(ROOT)}")
