"""The numbers and claims the docs state, against the code constants they describe (issue 45:
a threshold, a default, a size or a list that drifted from the code once must fail here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

from lightning_triage import LossCurveMonitor, Triage
from lightning_triage.callbacks._monitor import WindowMixin
from lightning_triage.functional.curve import CurveThresholds
from lightning_triage.functional.gradients import GradThresholds

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _page(name: str) -> str:
    return " ".join((DOCS / name).read_text().split())  # line breaks as spaces


def test_long_run_thresholds_are_the_codes() -> None:
    curve, grad = CurveThresholds(), GradThresholds()
    text = _page("long_run.md")
    assert f"| `curve.loss_spike` | a loss `spike` | z {curve.spike_z:g}, ratio {curve.spike_ratio:g}," \
        in text
    assert f"| `grad.spike` | a total-norm `spike` | z {grad.spike_z:g}, ratio {grad.spike_ratio:g} |" \
        in text
    assert curve.spike_warmup == grad.spike_warmup
    assert f"before the baseline is warm ({curve.spike_warmup} steps)" in text


def test_flush_interval_is_as_documented() -> None:
    """The default flush interval: the smallest multiple of `log_every_n_steps` at least 100, at
    most 256 unless `log_every_n_steps` is larger (docs/long_run.md)."""
    for page in ("long_run.md",):
        assert ("the smallest multiple of `log_every_n_steps` that is at least 100, at most 256 "
                "unless `log_every_n_steps` is larger") in _page(page)

    def interval(every: int) -> int:
        mixin = SimpleNamespace(_flush_n=None, flush_every_n_steps=None)
        return WindowMixin.flush_interval(mixin, SimpleNamespace(log_every_n_steps=every))  # type: ignore[arg-type]

    for every in (1, 7, 50, 99, 100, 101, 130, 255, 256, 300, 1000):
        n = interval(every)
        assert n % every == 0 or (every < 256 and n <= 256), (every, n)
        assert n >= min(100, every) and (n <= 256 or n == every), (every, n)
    assert interval(50) == 100 and interval(130) == 130 and interval(90) == 180 and interval(300) == 300


def test_defaults_the_docs_name_are_the_signatures() -> None:
    triage = Triage()
    assert f"the default is {triage.overfit_time_budget:g} s" in _page("findings.md")
    monitor = LossCurveMonitor()
    curves = _page("curves.md")
    assert (f"the first `window_epochs` epochs (default {monitor.window_epochs}) or the first "
            f"`window_steps` optimizer steps (default {monitor.window_steps})") in curves
    assert (f"the longer of {monitor.window_epochs} epochs and {monitor.window_steps} optimizer "
            "steps") in curves
    assert f"`max_window_steps` (default {monitor.max_window_steps})" in curves


def test_zero_interference_has_two_documented_exceptions() -> None:
    """The non-finite policy (whose default ends the run) and `on_spike="skip"`: no page says
    there is one."""
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        text = " ".join(page.read_text().split())
        assert "the one documented exception" not in text.lower(), page.name
        if "documented exception" in text:
            assert "two documented exceptions" in text, page.name


def test_curves_page_names_each_known_false_alarm() -> None:
    """Each strict xfail of the labeled curves (`KNOWN_FALSE_ALARMS`) is named, and the page
    says how many are left."""
    tree = ast.parse((ROOT / "tests" / "functional" / "test_curve.py").read_text())
    [known] = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
               and any(getattr(t, "id", "") == "KNOWN_FALSE_ALARMS" for t in node.targets)]
    text = _page("curves.md")
    words = {1: "one", 2: "two", 3: "three"}
    assert f"{words.get(len(known), len(known))} strict `xfail` is left" in text \
        or f"{words.get(len(known), len(known))} strict `xfail` cases are left" in text
    for (name, seed), code in known.items():
        assert f"`{code}` on" in text and f"seed {seed}" in text, (name, seed, code)


def test_sample_html_weighs_what_the_report_page_says() -> None:
    low, high = map(int, re.findall(r"weighs about (\d+)-(\d+) kB", _page("report.md"))[0])
    size = (DOCS / "samples" / "report_lr50.html").stat().st_size / 1000
    assert low <= size <= high, f"the sample HTML weighs {size:.0f} kB, docs/report.md says {low}-{high}"


def test_distributed_page_lists_every_check_skipped_under_sharding() -> None:
    """Every check that asks `sharded_strategy` is named in the page's "Sharded strategies"
    paragraph, and so is the remedy trial (`_remedy.unavailable`)."""
    [paragraph] = re.findall(r"\*\*Sharded strategies\.\*\*(.*?)(?: - \*\*|$)", _page("distributed.md"))
    callbacks = ROOT / "src" / "lightning_triage" / "callbacks"
    for module in sorted(callbacks.glob("*.py")):
        source = module.read_text()
        if "sharded_strategy(trainer)" not in source:
            continue
        if module.name == "_remedy.py":
            assert "remedy trial" in paragraph
            continue
        names = re.findall(r"^class (\w+)\(TriageCallback\)", source, flags=re.M)
        assert names and all(f"`{n}`" in paragraph for n in names), (module.name, names)


def test_runnable_snippets_import_what_they_use() -> None:
    """A Python snippet of a page that builds a `Trainer` imports it itself (readers paste one
    snippet, not the page)."""
    for page in sorted(DOCS.glob("*.md")):
        for code in re.findall(r"^```python\n(.*?)^```$", page.read_text(), flags=re.S | re.M):
            if re.search(r"^\S.*\bTrainer\(", code, flags=re.M) and "import" in code:
                assert re.search(r"import .*\bTrainer\b", code), (page.name, code[:200])


def test_changelog_says_none_only_of_codes_without_a_remedy() -> None:
    """A changelog sentence that says codes stay without a remedy (`none`) names only codes whose
    registry row has none (the mode codes got their trials later)."""
    from lightning_triage.findings import CODES

    text = " ".join((ROOT / "CHANGELOG.md").read_text().split())
    for sentence in re.split(r"(?<=[.;])\s", text):
        if re.search(r"\bstays? `none`", sentence):
            named = [c for c in re.findall(r"`([a-z_]+\.[a-z_]+)`", sentence) if c in CODES]
            assert named and all(CODES[c].remedy == "none" for c in named), sentence
