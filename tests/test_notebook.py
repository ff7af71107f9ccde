"""The walkthrough notebook runs top to bottom (its last cell asserts each diagnosis) and is
committed without outputs."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "walkthrough.ipynb"


def test_walkthrough_is_committed_without_outputs() -> None:
    raw = json.loads(NOTEBOOK.read_text())
    nbformat.validate(nbformat.reads(NOTEBOOK.read_text(), as_version=4))
    code = [c for c in raw["cells"] if c["cell_type"] == "code"]
    assert code, "the walkthrough has no code cells"
    dirty = [i for i, c in enumerate(code) if c.get("outputs") or c.get("execution_count") is not None]
    assert not dirty, f"strip the outputs of code cells {dirty} (notebooks/README.md says how)"
    assert not any(c.get("attachments") for c in raw["cells"])


def test_walkthrough_executes(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on a failure
    summary = nb.cells[-1]["outputs"]
    text = "".join(o.get("text", "") for o in summary)
    assert "future-mask-lm" in text and "structure.causal_leak" in text, text


def test_docs_page_shows_the_notebooks_current_cells() -> None:
    """docs/walkthrough.md (docs/make_walkthrough.py: the notebook executed, with its outputs)
    holds the notebook's code cells as they are now: regenerate it after editing the notebook."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_walkthrough", NOTEBOOK.parents[1] / "docs" / "make_walkthrough.py")
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    raw = json.loads(NOTEBOOK.read_text())
    cells = ["".join(c["source"]).strip() for c in raw["cells"] if c["cell_type"] == "code"]
    page = make.PAGE.read_text()
    assert make.code_sources(page) == cells, "run `PYTHONPATH=src python docs/make_walkthrough.py`"
    assert page.count("```text\n") >= len(cells) // 2, "the page lost the notebook's outputs"
