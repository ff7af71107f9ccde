"""Regenerate the API reference pages (docs/api/*.md) from ``__all__``: python docs/make_api_pages.py

Every public name of ``lightning_triage`` and ``lightning_triage.functional`` gets a
mkdocstrings entry; ``tests/test_docs.py`` checks that the committed pages are up to date.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import lightning_triage
import lightning_triage.functional as functional

API = Path(__file__).with_name("api")

CALLBACKS_HEAD = """# Callbacks

`Triage` is the one to add to a `Trainer`; every check is also a callback of its own
(`from lightning_triage import InitialLossCheck`). See the [configuration
reference](../configuration.md) for every argument in one table.
"""

FINDINGS_HEAD = """# Findings and the report

The `Finding` model, the registry of public codes (`CODES`) and the protocol's stages
(`STAGES`); the report lives in the package `lightning_triage.report`, one module per output
(`build`, `text`, `markdown`, `html`, `plots`, `console`, `files`, `load`, `schema`, `safe`), and
`lightning_triage.report` re-exports the names below.
"""

FUNCTIONAL_HEAD = """# Functional core

`lightning_triage.functional`: pure functions over tensors and numbers, with no `Trainer`.
Use them from a plain PyTorch loop; the callbacks call them. Each stage's rules return a
`Verdict` (code, step, message with the run's numbers); they live beside the statistics they
read: `functional.data.verdicts`, `functional.structure_verdicts`, `functional.overfit_verdicts`,
`functional.numerics`, `functional.curve`, `functional.gradients`. What a check decides over the
steps of a run lives in a watch the callback only feeds: `functional.update_ledger`,
`functional.curve_watch`, `functional.gradient_watch`.
"""

REPORT_EXTRA = ["lightning_triage.findings.sort_findings", "lightning_triage.ranking.rank",
                "lightning_triage.ranking.start_here",
                "lightning_triage.report.schema.REPORT_SCHEMA",
                "lightning_triage.report.build.build_report",
                "lightning_triage.report.files.write_report",
                "lightning_triage.report.console.print_report",
                "lightning_triage.report.markdown.render_markdown",
                "lightning_triage.report.load.load_report",
                "lightning_triage.report.schema.validate_report"]


def entry(path: str) -> str:
    return f"::: {path}\n"


def pages() -> dict[str, str]:
    top = [n for n in lightning_triage.__all__ if n != "__version__"]
    callbacks = [n for n in top if inspect.isclass(getattr(lightning_triage, n))
                 and n not in ("Finding",)]
    rest = [n for n in top if n not in callbacks]
    callbacks.sort(key=lambda n: (n not in ("Triage", "TriageReport", "TriageCallback"), n))
    return {
        "callbacks.md": CALLBACKS_HEAD + "\n" + "\n".join(entry(f"lightning_triage.{n}")
                                                          for n in callbacks),
        "findings.md": FINDINGS_HEAD + "\n" + "\n".join(
            [entry(f"lightning_triage.{n}") for n in rest] + [entry(p) for p in REPORT_EXTRA]),
        "functional.md": FUNCTIONAL_HEAD + "\n" + "\n".join(
            entry(f"lightning_triage.functional.{n}") for n in functional.__all__),
    }


if __name__ == "__main__":
    for name, text in pages().items():
        (API / name).write_text(text)
