from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml  # PyYAML: a dependency of Lightning
from lightning.pytorch.callbacks import Callback

import lightning_triage
import lightning_triage.functional as functional
from lightning_triage.callbacks import CHECKS, TriageCallback, code_owners
from lightning_triage.findings import CODES, STAGES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_finding_code_is_documented() -> None:
    text = (DOCS / "findings.md").read_text()
    missing = [code for code in CODES if f"`{code}`" not in text]
    assert not missing, f"run `python docs/make_code_tables.py`; missing: {missing}"


def test_generated_code_tables_are_up_to_date() -> None:
    make = _load("make_code_tables")
    stale = [str(p.relative_to(ROOT)) for p in make.stale()]
    assert not stale, f"run `python docs/make_code_tables.py`; stale: {stale}"
    blocks = "".join(p.read_text() for p in make.pages())
    for name in ("stages", "stages:linked", "codes", "code-list", "codes:data", "codes:numerics"):
        assert f"<!-- generated: {name} -->" in blocks, f"no generated block {name!r} left in the docs"


def test_every_finding_code_is_explained_on_its_stage_page() -> None:
    stage_pages = _load("make_code_tables").STAGE_PAGES
    missing = []
    for code in CODES:
        stage = code.split(".")[0]
        assert stage in stage_pages, f"new stage {stage!r}: add its page to STAGE_PAGES and mkdocs.yml"
        text = "".join((DOCS / page).read_text() for page in stage_pages[stage])
        if f"`{code}`" not in text:
            missing.append((code, stage_pages[stage]))
    assert not missing, f"codes without an entry on their stage page: {missing}"


def _api_entries() -> set[str]:
    text = "".join(p.read_text() for p in sorted((DOCS / "api").glob("*.md")))
    return set(re.findall(r"^::: ([\w.]+)$", text, flags=re.MULTILINE))


def test_every_public_name_is_in_the_api_reference() -> None:
    entries = _api_entries()
    public = [f"lightning_triage.{n}" for n in lightning_triage.__all__ if n != "__version__"]
    public += [f"lightning_triage.functional.{n}" for n in functional.__all__]
    missing = [name for name in public if name not in entries]
    assert not missing, f"run `python docs/make_api_pages.py`; missing: {missing}"


def test_api_pages_are_up_to_date() -> None:
    for name, text in _load("make_api_pages").pages().items():
        assert (DOCS / "api" / name).read_text() == text, "run `python docs/make_api_pages.py`"


def test_every_api_entry_resolves() -> None:
    for entry in _api_entries():
        module_name, _, attr = entry.rpartition(".")
        module = importlib.import_module(module_name)
        assert hasattr(module, attr), entry


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")]
    missing = [p for p in pages if f" {p}" not in nav]
    assert not missing, f"add to the nav of mkdocs.yml: {missing}"


def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert (tmp_path / "api" / "functional" / "index.html").exists()


def test_configuration_reference_matches_the_signatures() -> None:
    make = _load("make_config_reference")
    text = (DOCS / "configuration.md").read_text()
    assert make.tables() in text, "run `python docs/make_config_reference.py`"
    public_callbacks = {n for n in lightning_triage.__all__
                        if inspect.isclass(getattr(lightning_triage, n))
                        and issubclass(getattr(lightning_triage, n), Callback)
                        and n != "TriageCallback"}
    assert public_callbacks == set(make.CLASSES), "export the callback and add it to callbacks.CHECKS"


@pytest.mark.parametrize("name", ["Triage", "TriageReport", *(c.__name__ for c in CHECKS)])
def test_every_argument_is_typed_and_documented(name: str) -> None:
    cls = getattr(lightning_triage, name)
    rows = _load("make_config_reference").rows(cls)
    assert rows
    undocumented = [arg for arg, _, _, doc in rows if not doc]
    assert not undocumented, f"{name}: no `Args:` entry for {undocumented}"
    untyped = [arg for arg, kind, _, _ in rows if kind == "Any"]
    assert not untyped, f"{name}: untyped arguments {untyped}"


def _yaml_callbacks(path: Path) -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.DOTALL)
    callbacks = []
    for block in blocks:
        config = yaml.safe_load(block)
        callbacks += config.get("trainer", {}).get("callbacks", [])
    return callbacks


def test_templates_page_shows_the_shipped_config() -> None:
    shipped = (DOCS.parent / "configs" / "triage.yaml").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "templates.md").read_text(), flags=re.DOTALL)
    assert shipped in blocks, "docs/templates.md: paste configs/triage.yaml as it is"


@pytest.mark.parametrize("page", ["templates.md", "configuration.md", "../README.md"])
def test_yaml_examples_build_the_callbacks(page: str) -> None:
    callbacks = _yaml_callbacks(DOCS / page)
    assert callbacks, f"no LightningCLI callbacks in the YAML blocks of {page}"
    for spec in callbacks:
        module_name, _, name = spec["class_path"].rpartition(".")
        cls = getattr(importlib.import_module(module_name), name)
        callback = cls(**spec.get("init_args", {}))  # validates every argument
        assert isinstance(callback, Callback)
@pytest.mark.parametrize("name", [n for n in lightning_triage.__all__ if n != "__version__"]
                         + [f"functional.{n}" for n in functional.__all__])
def test_public_name_has_a_docstring_with_an_example(name: str) -> None:
    obj = lightning_triage
    for part in name.split("."):
        obj = getattr(obj, part)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return  # constants (CODES, STAGES) are documented on their pages
    doc = inspect.getdoc(obj) or ""
    assert "Example:" in doc or "Examples:" in doc, f"{name}: no Google-style `Example:` section"
    assert ">>>" in doc, f"{name}: the example is not a doctest"




def test_gallery_shows_real_messages_of_registered_codes() -> None:
    text = (DOCS / "gallery.md").read_text()
    entries = re.findall(r"^## `([\w.]+)`\n\n\*(\w+)\* — run: (.+?)\n\n> (.+?)\n\n\*\*Next:\*\* ", text,
                         flags=re.MULTILINE | re.DOTALL)
    headings = re.findall(r"^## `([\w.]+)`", text, flags=re.MULTILINE)
    assert len(entries) == len(headings) >= 30, "regenerate: python docs/make_gallery.py"
    for code, severity, _, message in entries:
        assert code in CODES, f"gallery shows an unregistered code {code!r}"
        assert severity in ("error", "warning", "info") and message.strip()


def test_sample_html_report_is_a_self_contained_triage_report() -> None:
    """docs/samples/report_lr50.html (docs/make_report_sample.py): a lightning-triage page with
    its plots inline, nothing fetched from the network, small enough to commit; the page embeds
    it."""
    sample = DOCS / "samples" / "report_lr50.html"
    text = sample.read_text(encoding="utf-8")
    assert sample.stat().st_size < 300_000
    assert text.startswith("<!DOCTYPE html>") and "<title>lightning-triage: DigitsMLP</title>" in text
    assert "Start here" in text and "curve.diverging" in text and "explained by" in text
    assert re.search(r"<img src=\"data:image/png;base64,", text), "plots are not inline"
    assert not re.search(r"(src|href)=\"(?!data:|#)", text), "the page links to a file or URL"
    assert "http://" not in text and "https://" not in text
    assert 'src="../samples/report_lr50.html"' in (DOCS / "report_sample.md").read_text()



def _package_checks(cls: type = TriageCallback) -> list[type]:
    """Every public TriageCallback subclass the package defines (private bases left out)."""
    out = []
    for sub in cls.__subclasses__():
        parts = sub.__module__.split(".")
        if parts[:2] == ["lightning_triage", "callbacks"] and not parts[-1].startswith("_"):
            out.append(sub)
        out += _package_checks(sub)
    return out


def test_checks_is_the_list_of_every_check_in_protocol_order() -> None:
    defined = {c.__name__ for c in _package_checks()} - {"Triage"}
    assert defined == {c.__name__ for c in CHECKS}, "add the check to callbacks.CHECKS"
    for cls in CHECKS:
        assert "stage" in vars(cls) and "codes" in vars(cls), f"{cls.__name__}: declare stage and codes"
        assert cls.stage in STAGES, f"{cls.__name__}.stage = {cls.stage!r}"
    stages = [STAGES.index(cls.stage) for cls in CHECKS]
    assert stages == sorted(stages), "callbacks.CHECKS is in protocol order"


def test_every_code_is_declared_by_exactly_one_check() -> None:
    owners = code_owners()
    unregistered = sorted(set(owners) - set(CODES))
    assert not unregistered, f"declared codes missing from findings._SPECS: {unregistered}"
    undeclared = sorted(set(CODES) - set(owners))
    assert not undeclared, f"registered codes no check declares in its `codes`: {undeclared}"
    shared = {code: names for code, names in owners.items() if len(names) > 1}
    assert not shared, f"codes declared by more than one class (use `shared_codes`): {shared}"
    for cls in CHECKS:
        wrong = [c for c in cls.codes if c.split(".")[0] != cls.stage]
        assert not wrong, f"{cls.__name__} declares codes of another stage: {wrong}"
        assert set(cls.shared_codes) <= set(owners), f"{cls.__name__}: unknown shared codes"


def test_gallery_holds_every_code_once_without_wall_times() -> None:
    """Each registered code has an entry in docs/gallery.md or is on its list of codes without
    a recorded example (`python docs/make_gallery.py --only CODE` puts a new code on one)."""
    make = _load("make_gallery")
    text = (DOCS / "gallery.md").read_text()
    entries = make.read_entries(text)
    _, _, rest = text.partition(make.MISSING_HEADING)
    without = re.findall(r"^- `([\w.]+)`$", rest, flags=re.MULTILINE)
    assert not set(entries) & set(without), "a code with an entry is listed as without one"
    missing = sorted(set(CODES) - set(entries) - set(without))
    assert not missing, f"run `python docs/make_gallery.py --only CODE` for {missing}"
    assert set(entries) | set(without) <= set(CODES), "the gallery shows unregistered codes"
    assert not make._WALL_TIME.search(text), "wall times churn the gallery: strip them"
    assert make.read_entries(make.page(entries)) == entries  # --only keeps the other entries as they are


# ------------------------------------------------------------------ the changelog names what exists
CHANGELOG = ROOT / "CHANGELOG.md"
#: `Triage(old=)` -> `new` (also `A`/`B(old=)` -> `new`): a rename entry's old and new names.
_RENAMED = re.compile(r"`(?:\w+\()?(\w+)=?\)?`\s*->\s*`(\w+)`")
_CALL_ARG = re.compile(r"`(\w+)\((\w+)=")
_FILE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|yaml|ipynb|json|toml))\b")
_SCENARIO = re.compile(r"`([\w-]+)` (?:demo )?scenario|demo(?:'s)? (?:scenario )?`([\w-]+)`"
                       r"|the `([\w-]+)` demo")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0]: part for part in parts}


def _entries(section: str) -> list[str]:
    return [e for e in re.split(r"\n- ", section)[1:]]


def _parameters(name: str) -> set[str] | None:
    """The keyword names a public callable of lightning_triage takes (None: not ours, or takes
    any keyword)."""
    obj = getattr(lightning_triage, name, None)
    if obj is None or not callable(obj):
        return None
    params = inspect.signature(obj).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _entry_problems(entry: str, renamed: dict[str, str], scenarios: set[str]) -> list[str]:
    problems: list[str] = []
    body = _RENAMED.sub("", entry)  # a rename's old side is the one place for old names
    problems += [f"`{old}` was renamed `{new}` in this section" for old, new in renamed.items()
                 if re.search(rf"`[^`\n]*\b{old}\b[^`\n]*`", body)]
    calls = _CALL_ARG.findall(body)
    head = re.match(r"`(\w+)`", entry)
    if head and "Arguments:" in entry:
        listed = entry.split("Arguments:", 1)[1].split(".\n", 1)[0]
        calls += [(head[1], arg) for arg in re.findall(r"`(\w+)`", listed)]
    for name, arg in calls:
        params = _parameters(name)
        if params is not None and arg not in params:
            problems.append(f"`{name}` takes no argument `{arg}`")
    problems += [f"`{dotted}` does not exist"
                 for dotted in re.findall(r"`(lightning_triage(?:\.\w+)+)", entry)
                 if not _resolves(dotted)]
    problems += [f"no file {path}" for path in _FILE.findall(entry)
                 if not path.startswith("triage_report.") and not any(
                     (ROOT / base / path).exists() for base in ("", "src", "examples", "docs"))]
    for match in _SCENARIO.finditer(entry):
        name = next(g for g in match.groups() if g)
        if name not in scenarios and "tests/scenarios" not in entry:
            problems.append(f"`{name}` is not a demo scenario")
    return problems


def changelog_problems(text: str) -> list[str]:
    """What a changelog says that the code or the repository does not have: arguments of our
    public callables that they do not take (`Triage(x=...)`, an entry's "Arguments:" list),
    names that a rename entry of the same section renamed, `lightning_triage.*` names that do
    not resolve, files that do not exist and demo scenarios that the demo does not have."""
    from lightning_triage.demo import SCENARIOS

    scenarios = {s.name for s in SCENARIOS}
    problems: list[str] = []
    for title, section in _sections(text).items():
        renamed = {old: new for old, new in _RENAMED.findall(section) if old != new}
        for entry in _entries(section):
            problems += [f"{title}: {p}" for p in _entry_problems(entry, renamed, scenarios)]
    return problems


def test_changelog_names_what_the_code_has() -> None:
    pytest.importorskip("sklearn")  # lightning_triage.demo's scenarios
    problems = changelog_problems(CHANGELOG.read_text())
    assert not problems, problems


def test_changelog_check_finds_each_kind_of_mismatch() -> None:
    pytest.importorskip("sklearn")
    page = ("## [Unreleased]\n\n### Added\n\n"
            "- `Triage`: the bundle. Arguments: `report_dir`, `overfit_steps`.\n"
            "- `Triage(overfit_budget=2)` bounds the probe; `lightning_triage.nowhere` helps.\n"
            "- New codes beyond DESIGN.md; the `lr-0` scenario; the `lr-50` demo.\n\n"
            "### Changed\n\n- Renamed: `Triage(overfit_steps=)` -> `overfit_max_steps`.\n")
    problems = changelog_problems(page)
    assert problems == [
        "[Unreleased]: `overfit_steps` was renamed `overfit_max_steps` in this section",
        "[Unreleased]: `Triage` takes no argument `overfit_steps`",
        "[Unreleased]: `Triage` takes no argument `overfit_budget`",
        "[Unreleased]: `lightning_triage.nowhere` does not exist",
        "[Unreleased]: no file DESIGN.md",
        "[Unreleased]: `lr-0` is not a demo scenario",
    ], problems


# ------------------------------------------------- one place says where the measurements were taken
_HARDWARE_CLAIM = re.compile(r"(?:GPU|accelerator)\s+(?:was|were)\s+lent|all\s+are\s+CPU"
                             r"|every\s+number\s+is\s+CPU|no\s+GPU\s+timing", re.IGNORECASE)


def test_pages_take_where_they_were_measured_from_one_place() -> None:
    """Where the documented timings were measured (CPU only; a GPU for correctness) is said by
    one generated block (`docs/make_code_tables.py`, `MEASURED`): pages that report dated runs
    carry it, and no page says it in words of its own (docs/benchmarks.md once said "no GPU was
    lent" above a measured H200 section)."""
    make = _load("make_code_tables")
    block = f"<!-- generated: measured -->\n{make.measured()}\n<!-- end generated -->"
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        text = page.read_text()
        outside = text.replace(block, "")
        claims = _HARDWARE_CLAIM.findall(outside)
        assert not claims, f"{page.name} says where it measured in its own words: {claims}"
        if re.search(r"\bRuns? of \**20\d\d-", text):
            assert block in text, f"{page.name} reports dated runs: add <!-- generated: measured -->"
    assert _HARDWARE_CLAIM.search(make.measured())


def test_make_demo_writes_where_the_samples_say() -> None:
    """The README's samples end with `full report: runs/demo/...`: `make demo` writes there (and
    `run_demo` ends by printing the next commands for those paths)."""
    samples = _load("make_samples")
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert f"-m lightning_triage demo --report-root {samples.REPORT_ROOT}" in recipe


def test_gallery_only_reruns_the_entry_of_the_code_asked_for() -> None:
    """`make_gallery.py --only CODE` reruns the run the code's entry names; for a new code,
    only the runs no entry names yet (the one added for it to the registry of broken runs)."""
    pytest.importorskip("sklearn")  # the registry's runs
    make = _load("make_gallery")
    entries = make.read_entries((DOCS / "gallery.md").read_text())
    code = "init.loss_above_chance"
    story = make._named_story(entries[code], [s.story for s in make.RUNS])
    assert [s.story for s in make.scenarios_for([code], entries)] == [story]
    fresh = dataclasses.replace(make.RUNS[0], name="fresh", story="a story no entry names")
    runs = make.RUNS
    try:
        make.RUNS = [*runs, fresh]
        new = {c: e for c, e in entries.items() if c != "init.chance_unknown"}  # as if new
        chosen = [s.story for s in make.scenarios_for(["init.chance_unknown"], new)]
    finally:
        make.RUNS = runs
    # exactly the runs no entry of the page names (the fresh one among them), not every run
    named = {make._named_story(entry, [s.story for s in runs]) for entry in new.values()}
    assert chosen == [s.story for s in [*runs, fresh] if s.story not in named]
    assert fresh.story in chosen and len(chosen) < len(runs)
    # the gallery writes what the registry holds: its runs are the registry's, after a healthy one
    from lightning_triage.demo.broken import BROKEN_RUNS

    assert runs[1:] == BROKEN_RUNS and runs[0].expect is None


def test_each_check_docstring_lists_its_codes() -> None:
    """A check's docstring names every code it owns (the API pages show it)."""
    from lightning_triage.callbacks import CHECKS, TriageReport

    for cls in (*CHECKS, TriageReport):
        missing = [c for c in cls.codes if c != "triage.check_error"
                   and f"``{c}``" not in (cls.__doc__ or "")]
        assert not missing, f"{cls.__name__}'s docstring does not name {missing}"
