"""Every Python and shell block of the README and the docs runs, as a reader would paste it.

The blocks of one page run in order in a fresh directory (``tmp_path``, where ``examples/`` and
``configs/`` of the repository are linked, as from a clone's root): Python blocks in one
namespace, as in a session, and shell blocks line by line, each line required to exit 0:
``lightning-triage ...`` and ``python ...`` lines in this process (the same entry points, without
a new interpreter's seconds of imports), any other line under ``bash``. Markers in the Markdown
source, on the line before a block:

- ``<!-- skip: REASON -->``: not run (installs packages, trains every demo scenario, ...);
- ``<!-- file: NAME -->``: a script, written to ``NAME`` for a later block to run.

Nothing else runs: a block that reads a file (a run's report) follows the visible block that
makes it, so a reader who pastes the page in order gets the same result. A hidden set-up step
(a marker that ran code the page does not show) is refused.

A Python block that defines ``test_*`` functions (a pytest example) has them called, with a
fresh ``tmp_path`` where they ask for one. Trainers get fast defaults from Lightning's
``PL_TRAINER_*`` variables (they give way to any argument the snippet passes), so a snippet's
``Trainer(max_epochs=3)`` trains a few steps.
"""

from __future__ import annotations

import inspect
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("python", "bash")
BLOCK = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<code>.*?)^```$", flags=re.DOTALL | re.MULTILINE)
MARK = re.compile(r"<!-- (?P<kind>skip|file): (?P<arg>.+?) -->\n$")
#: Any HTML comment marker before a block that is not ``skip`` or ``file`` (e.g. a hidden
#: ``setup`` line): code the reader would not see.
HIDDEN = re.compile(r"<!-- (?!skip:|file:)[\w-]+: .*?-->\n```")
FAST = {"PL_TRAINER_MAX_STEPS": "8", "PL_TRAINER_LIMIT_VAL_BATCHES": "2",
        "PL_TRAINER_ENABLE_PROGRESS_BAR": "False", "PL_TRAINER_ENABLE_MODEL_SUMMARY": "False"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mark: str | None = None  # "skip" or "file"
    arg: str = ""

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page with the marker on the line before each."""
    text = page.read_text()
    out = []
    for m in BLOCK.finditer(text):
        before = text[:m.start()]
        mark = MARK.search(before[before.rfind("\n", 0, len(before) - 1) + 1:])
        out.append(Block(page, before.count("\n") + 1, m["lang"], m["code"],
                         mark["kind"] if mark else None, mark["arg"] if mark else ""))
    return out


def runnable_pages() -> list[Path]:
    return [p for p in PAGES if any(b.lang in RUN and b.mark != "skip" for b in blocks(p))]


def test_every_python_and_shell_block_runs_or_says_why_not() -> None:
    unmarked = [b.where for p in PAGES for b in blocks(p) if b.lang in ("", "sh", "shell", "py",
                                                                       "console", "pycon")]
    assert not unmarked, f"say the language of these blocks (python, bash, text ...): {unmarked}"
    reasons = [b.arg for p in PAGES for b in blocks(p) if b.mark == "skip"]
    assert all(len(r.split()) >= 3 for r in reasons), f"say why a block does not run: {reasons}"
    assert len(runnable_pages()) >= 8



def test_no_block_depends_on_hidden_set_up() -> None:
    """What a block reads is made by a block the reader sees: no marker runs hidden code."""
    hidden = [f"{p.relative_to(ROOT)}:{p.read_text()[:m.start()].count(chr(10)) + 1}"
              for p in PAGES for m in HIDDEN.finditer(p.read_text())]
    assert not hidden, f"make what these blocks read in a visible block: {hidden}"
    assert HIDDEN.search("<!-- setup: main() -->\n```python\n")
    assert not HIDDEN.search("<!-- skip: installs packages -->\n```bash\n")

def _call(argv: list[str]) -> int:
    """Run one command line as the shell would, in this process when it is ``lightning-triage``
    or ``python`` (the same entry points, without a new interpreter's seconds of imports)."""
    from lightning_triage.__main__ import main

    if argv[:3] == ["python", "-m", "lightning_triage"]:
        argv = ["lightning-triage", *argv[3:]]
    try:
        if argv[0] == "lightning-triage":
            return main(argv[1:])
        if argv[:2] == ["python", "-m"]:
            sys.argv = [argv[2], *argv[3:]]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            return 0
        if argv[0] == "python":
            sys.argv = argv[1:]
            runpy.run_path(argv[1], run_name="__main__")
            return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", shlex.join(argv)], env=env,
                          timeout=240).returncode


def _run_shell(block: Block) -> None:
    for line in block.code.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            code = _call(argv)
            assert code == 0, f"{block.where}: `{line.strip()}` exited {code}"


def _run_python(block: Block, namespace: dict[str, Any], tmp_path: Path) -> None:
    before = set(namespace)
    exec(compile(block.code, block.where, "exec"), namespace)
    for name in sorted(set(namespace) - before):
        fn = namespace[name]
        if name.startswith("test_") and inspect.isfunction(fn):
            params = inspect.signature(fn).parameters
            sub = tmp_path / name
            sub.mkdir()
            fn(**({"tmp_path": sub} if "tmp_path" in params else {}))


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: p.name)
def test_page_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("examples", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    for key, value in FAST.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["snippet"])
    namespace: dict[str, Any] = {"__name__": "__snippet__"}
    for block in blocks(page):
        if block.lang not in RUN or block.mark == "skip":
            continue
        if block.mark == "file":
            (tmp_path / block.arg).write_text(block.code)
            continue
        try:
            if block.lang == "python":
                _run_python(block, namespace, tmp_path)
            else:
                _run_shell(block)
        except Exception as exc:
            raise AssertionError(f"{block.where} failed:\n{block.code}") from exc


def test_a_snippet_that_raises_or_exits_nonzero_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- skip: for no good reason -->\n```python\n1 / 0\n```\n\n"
                    "```python\ntrainer = Trainer()\n```\n\n```bash\nlightning-triage show nowhere\n```\n")
    skipped, python, shell = blocks(page)
    assert (skipped.mark, skipped.arg, python.mark) == ("skip", "for no good reason", None)
    with pytest.raises(NameError, match="Trainer"):
        _run_python(python, {}, tmp_path)
    with pytest.raises(AssertionError, match="exited 2"):
        _run_shell(shell)
