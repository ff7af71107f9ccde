"""The report as one self-contained HTML page: verdict, protocol checklist, plots, findings.

Rendered from the report dict alone (so ``lightning-triage html report.json`` re-renders a saved
report). The page needs no JavaScript and no network: styles are inline and plots are PNG
images embedded as base64 ``data:`` URIs. Plots need matplotlib (the ``report`` extra, or
``pip install matplotlib``: the package is not on PyPI yet); without it the page shows the
same data as tables.

Every string of the report is text, by construction: the page is built from
:class:`markupsafe.Markup` templates whose arguments are escaped unless they are markup built
here (a test checks this module writes no HTML any other way), and the page's
Content-Security-Policy forbids scripts and every network request. Plot labels are plain text to
matplotlib (no math text, no TeX); a plot that fails is replaced by its table, and a section
that fails by a note, so a valid report always gives a page.

Example:
    >>> from lightning_triage.findings import Finding
    >>> from lightning_triage.report import build_report
    >>> f = Finding.create("init.loss_above_chance", "loss 33.9", check="InitialLossCheck",
    ...                    global_step=0)
    >>> page = render_html(build_report([f], status="completed", run={}), plots=False)
    >>> "init.loss_above_chance" in page and "http://" not in page
    True
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from markupsafe import Markup

from lightning_triage.findings import STAGE_QUESTIONS, STAGES, stage_index
from lightning_triage.report.plots import SEV_COLOR as _SEV_COLOR
from lightning_triage.report.plots import batch_images as _batch_images
from lightning_triage.report.plots import chance_level as _chance
from lightning_triage.report.plots import curve_verdict as _curve_verdict
from lightning_triage.report.plots import draw as _draw
from lightning_triage.report.plots import figure_class as _matplotlib
from lightning_triage.report.plots import grad_plot as _grad_plot
from lightning_triage.report.plots import init_plot as _init_plot
from lightning_triage.report.plots import initial_loss as _initial_loss
from lightning_triage.report.plots import loss_plot as _loss_plot
from lightning_triage.report.plots import remedy_plot as _remedy_plot
from lightning_triage.report.plots import remedy_trial as _remedy_trial
from lightning_triage.report.safe import visible
from lightning_triage.report.text import lead_trial, marker_id, trial_hint

_STATUS_COLOR = {"passed": "#1e8449", "failed": "#c0392b", "skipped": "#7f8c8d",
                 "error": "#8e44ad", "not run": "#7f8c8d"}
_MAX_TABLE_ROWS = 24
#: No script, no network: only inline styles and the embedded PNG images.
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1c2833;
 background:#f4f6f7;font-size:15px;line-height:1.45}
main{max-width:1180px;margin:0 auto;padding:14px 20px 40px}
h1{font-size:21px;margin:4px 0 2px} h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #d5d8dc}
.meta{color:#566573;font-size:13px}
.verdict{border-radius:8px;padding:12px 16px;margin:10px 0;background:#fff;
 border-left:8px solid var(--c)}
.verdict .code{font-family:ui-monospace,Menlo,Consolas,monospace;font-weight:600;color:var(--c)}
.verdict p{margin:5px 0}
.sev{display:inline-block;min-width:58px;padding:0 6px;border-radius:4px;color:#fff;font-size:12px;
 text-align:center;font-weight:600}
table{border-collapse:collapse;background:#fff;font-size:13.5px;width:100%}
td,th{border:1px solid #e5e8e8;padding:4px 7px;text-align:left;vertical-align:top}
th{background:#eaeded} code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
.grid{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}
.grid figure{margin:0;background:#fff;padding:6px;border-radius:6px;flex:0 1 auto;max-width:100%}
figure img{max-width:100%;height:auto;display:block}
figcaption{font-size:12.5px;color:#566573;width:0;min-width:100%}
.finding{background:#fff;border-radius:6px;padding:8px 12px;margin:8px 0;border-left:5px solid var(--c)}
.finding p{margin:4px 0} details{font-size:12.5px} pre{white-space:pre-wrap;margin:4px 0}
.muted{color:#7f8c8d}
"""



def _remedy_html(f: Mapping[str, Any], report: Mapping[str, Any] | None = None) -> Markup:
    """The finding's remedy trial as a paragraph (empty when there is nothing to say); for the
    lead of ``report``, the trial that named it as the next candidate when it has none."""
    trial = lead_trial(report or {}, f)
    if trial is None:
        return Markup("")
    return Markup("<p><b>Remedy:</b> {}</p>").format(_md_code(trial))

def _join(parts: Iterable[Any], sep: str = "") -> Markup:
    """Join markup and text (text is escaped)."""
    return Markup(sep).join(parts)


def _md_code(text: Any) -> Markup:
    """``text`` as escaped text, its `backtick` spans as ``<code>``."""
    parts = str(text).split("`")
    return _join(Markup("<code>{}</code>").format(p) if i % 2 else p for i, p in enumerate(parts))


def _sev(severity: str) -> Markup:
    return Markup('<span class="sev" style="background:{}">{}</span>').format(
        _SEV_COLOR.get(severity, "#555"), severity)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Markup:
    """A table: markup cells as they are, other values formatted and escaped."""
    head = _join(Markup("<th>{}</th>").format(h) for h in header)
    body = _join(Markup("<tr>{}</tr>").format(_join(
        Markup("<td>{}</td>").format(c if isinstance(c, Markup) else _fmt(c)) for c in row))
        for row in rows)
    return Markup("<table><tr>{}</tr>{}</table>").format(head, body)


def _figure(src: str, caption: str) -> Markup:
    return Markup('<figure><img src="{}" alt="{}"><figcaption>{}</figcaption></figure>').format(
        src, caption, _md_code(caption))


def _batch_table(batch: Mapping[str, Any]) -> Markup:
    examples = batch.get("examples") or []
    targets = batch.get("targets") or []
    rows = []
    for i, ex in enumerate(examples[:_MAX_TABLE_ROWS]):
        flat = _flatten(ex)
        shown = ", ".join(_fmt(v) for v in flat[:16]) + (" …" if len(flat) > 16 else "")
        target = targets[i] if i < len(targets) else ""
        rows.append([i, Markup('<span class="mono">{}</span>').format(shown), target])
    return _table(["#", "values (first 16)", "target"], rows)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [v for item in value for v in _flatten(item)]
    return [value]


# ---------------------------------------------------------------------------- sections
def _header(report: Mapping[str, Any]) -> Markup:
    run = report.get("run", {})
    meta = [Markup("status <b>{}</b>").format(report.get("status"))]
    for key, label in (("model", "model"), ("global_step", "steps"), ("epochs", "epochs"),
                       ("precision", "precision"), ("strategy", "strategy")):
        if run.get(key) is not None:
            meta.append(Markup("{} <b>{}</b>").format(label, run[key]))
    counts = {s: 0 for s in ("error", "warning", "info")}
    for f in report.get("findings", []):
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    first = report.get("start_here")
    lead = next((f for f in report.get("findings", []) if f["code"] == first), None)
    if lead is not None:
        where = Markup("") if lead.get("global_step") is None else \
            Markup(" at step {}").format(lead["global_step"])
        if lead.get("layer") is not None:
            where += Markup(", layer <code>{}</code>").format(module_name(lead["layer"]))
        verdict = Markup(
            '<div class="verdict" style="--c:{color}"><div>Verdict: <b>{errors} error(s), '
            '{warnings} warning(s)</b>. Start here: <span class="code">{first}</span>{where}</div>'
            "<p><b>What:</b> {title}.</p><p><b>Why:</b> {message}</p>"
            "<p><b>Next:</b> {hint}</p>{trial}</div>").format(
                color=_SEV_COLOR[lead["severity"]], errors=counts["error"],
                warnings=counts["warning"], first=first, where=where, title=lead["title"],
                message=_md_code(lead["message"]), hint=_md_code(trial_hint(lead)),
                trial=_remedy_html(lead, report))
    else:
        verdict = Markup(
            '<div class="verdict" style="--c:#1e8449"><div><b>Verdict: no problems found.</b> '
            "{} info finding(s); every check that ran passed.</div></div>").format(counts["info"])
    return Markup('<h1>lightning-triage report</h1><div class="meta">{}</div>{}').format(
        _join(meta, " · "), verdict)


def _stage_status(problems: list[Any], stage_checks: list[Mapping[str, Any]]) -> str:
    if problems:
        return "failed"
    if any(c["status"] in ("passed", "failed") for c in stage_checks):
        return "passed"
    if any(c["status"] == "error" for c in stage_checks):
        return "error"
    return "skipped" if stage_checks else "not run"


def _stage_cell(f: Mapping[str, Any]) -> Markup:
    ev = ", ".join(f"{k}={_fmt(v)}" for k, v in f.get("evidence", {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool))[:160]
    step = "" if f.get("global_step") is None else f" step {f['global_step']}"
    explained = f.get("explained_by") or []
    cell = Markup("{} <code>{}</code>{} {}").format(_sev(f["severity"]), f["code"], step, f["title"])
    if explained:
        cell += Markup(' <span class="muted">(explained by {})</span>').format(", ".join(explained))
    if ev:
        cell += Markup('<br><span class="mono muted">{}</span>').format(ev)
    if f["severity"] != "info":
        cell += Markup("<br><i>Hint:</i> {}").format(_md_code(trial_hint(f)))
    return cell


def _check_stage(check: Mapping[str, Any], findings: Sequence[Mapping[str, Any]]) -> str | None:
    """The stage a check entry declares (reports before 0.1 lack it: the stage of its findings)."""
    if check.get("stage"):
        return str(check["stage"])
    return next((f["code"].split(".")[0] for f in findings if f.get("check") == check["check"]), None)


def _stage_rows(report: Mapping[str, Any]) -> list[list[Any]]:
    checks = report.get("checks", [])
    findings = report.get("findings", [])
    check_stage = {c["check"]: _check_stage(c, findings) for c in checks}
    rows = []
    for i, stage in enumerate(STAGES, 1):
        stage_checks = [c for c in checks if check_stage.get(c["check"]) == stage]
        stage_findings = [f for f in findings if f["code"].split(".")[0] == stage]
        problems = [f for f in stage_findings if f["severity"] != "info"]
        status = _stage_status(problems, stage_checks)
        shown = problems or stage_findings
        cells = [_stage_cell(f) for f in shown[:4]]
        if len(shown) > 4:
            cells.append(Markup('<span class="muted">and {} more below</span>').format(len(shown) - 4))
        detail = "; ".join(c["detail"] for c in stage_checks if c.get("detail"))
        if not cells and detail:
            cells.append(Markup('<span class="muted">{}</span>').format(_md_code(shorten(detail, 300))))
        rows.append([str(i),
                     Markup('<b>{}</b><br><span class="muted">{}</span>').format(
                         stage, STAGE_QUESTIONS[stage]),
                     Markup('<b style="color:{}">{}</b>').format(_STATUS_COLOR[status], status),
                     _join(cells, "<br>")])
    return rows


def _series_tables(report: Mapping[str, Any], names: Sequence[str]) -> Markup:
    parts = []
    for name in names:
        points = report.get("series", {}).get(name) or []
        if points:
            idx = _evenly(len(points), _MAX_TABLE_ROWS)
            parts.append(Markup("<h3>{}</h3>{}").format(name, _table(
                ["step", "value"], [[points[i][0], "nan/inf" if points[i][1] is None
                                     else points[i][1]] for i in idx])))
    return _join(parts)


def _loss_table(report: Mapping[str, Any]) -> Markup:
    out = _series_tables(report, ("train_loss", "val_loss"))
    chance = _chance(report)
    if chance is not None:
        out += Markup("<p>Chance level: <b>{}</b>. Curve: {}</p>").format(
            f"{chance:.4g}", _curve_verdict(report))
    return out


def _grad_table(report: Mapping[str, Any]) -> Markup:
    return _series_tables(report, ("grad_norm",))


def _init_table(report: Mapping[str, Any]) -> Markup:
    info = _initial_loss(report)
    return _table(["step-0 loss", "chance"], [[info.get("loss"), info.get("chance")]]) \
        if info else Markup("")


def _remedy_table(report: Mapping[str, Any]) -> Markup:
    remedy = _remedy_trial(report)
    if remedy is None:
        return Markup("")
    before, after = remedy["before"], remedy["after"]
    return _table(["replay", "steps", "final loss", "finite"],
                  [["as is", before.get("steps"), before.get("loss"), before.get("finite")],
                   ["remedied", after.get("steps"), after.get("loss"), after.get("finite")]])


#: The plots: how to draw each, its caption, and the table that stands in for it.
_PLOTS: tuple[tuple[Callable[..., str | None], str, Callable[..., Markup]], ...] = (
    (_loss_plot, "Training and validation loss; dashed: chance level; vertical lines: findings "
                 "at their steps.", _loss_table),
    (_grad_plot, "Gradient norms over the steps (per layer where recorded; white: zero); red "
                 "dashed lines: spikes.", _grad_table),
    (_init_plot, "Step-0 loss against the chance level: a fresh model should be near chance.",
     _init_table),
    (_remedy_plot, "The lead's fix tried on a copy: the training loss of the replayed steps, "
                   "as they were and with the remedy (x: the replay went non-finite).",
     _remedy_table),
)


def _plots(report: Mapping[str, Any], plots: bool) -> Markup:
    figure_cls = _matplotlib() if plots else None
    figures: list[Markup] = []
    tables: list[Markup] = []
    if figure_cls is None:
        tables.append(Markup('<p class="muted">Plots need matplotlib (<code>pip install '
                             'matplotlib</code>); the data is shown as tables.</p>'))
    for draw, caption, table in _PLOTS:
        src, failed = _draw(draw, figure_cls, report) if figure_cls is not None else (None, True)
        if src:
            figures.append(_figure(src, caption))
        elif failed:
            tables.append(table(report))
    grid = Markup('<div class="grid">{}</div>').format(_join(figures)) if figures else ""
    return _join([grid, *tables])


def _baselines(report: Mapping[str, Any]) -> Markup:
    """The simple baselines beside the model's validation metric (``details.baselines``)."""
    info = (report.get("details") or {}).get("baselines")
    if not isinstance(info, Mapping) or not isinstance(info.get("values"), Mapping):
        return Markup("")
    values = info["values"]
    rows = [[str(k).replace("_", "-"), v] for k, v in (values.get("scores") or {}).items()]
    model = info.get("model")
    if isinstance(model, Mapping):
        rows.append([f"the model (step {model.get('step')})", model.get("value")])
    return _join([Markup("<h2>Simple baselines</h2><p class=\"meta\">{} on the first {} "
                         "validation examples; fitted in closed form on {} training examples "
                         "({} features)</p>").format(
        values.get("metric"), values.get("val_examples"), values.get("train_examples"),
        values.get("features")), _table(["model", str(values.get("metric"))], rows)])


def _batch_and_frames(report: Mapping[str, Any], plots: bool) -> Markup:
    figure_cls = _matplotlib() if plots else None
    parts: list[Markup] = []
    details = report.get("details", {}) or {}
    batch = details.get("first_batch")
    if isinstance(batch, Mapping) and batch.get("examples") is not None:
        shape = "×".join(str(s) for s in batch.get("shape", []))
        title = Markup('<h2>First training batch</h2><p class="meta">tensor <code>{}</code> shape '
                       "{} {}, step {}; first {} examples</p>").format(
            batch.get("tensor"), shape, batch.get("dtype", ""), batch.get("global_step"),
            len(batch["examples"]))
        src = _draw(_batch_images, figure_cls, batch)[0] if figure_cls is not None else None
        grid = Markup('<div class="grid">{}</div>').format(
            _figure(src, "the first examples (targets above)")) if src else ""
        parts.append(_join([title, grid, _batch_table(batch)]))
    parts.append(_nan_frames(report))
    return _join(parts)


def _evenly(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, with an ellipsis when cut
    (the full text is in the checks table and the JSON).

    Example:
        >>> shorten("8 forward passes on 16 examples", 20)
        '8 forward passes on…'
        >>> shorten("short", 20)
        'short'
    """
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    if text[limit - 1] != " " and space > limit // 2:  # cut mid-word: back to the last space
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def module_name(name: Any) -> Any:
    """A module name as ``named_modules()`` gives it, for a reader: the root module's empty name
    reads ``(the model itself)``.

    Example:
        >>> module_name(""), module_name("net.2")
        ('(the model itself)', 'net.2')
    """
    return "(the model itself)" if name == "" else name


def _nan_frames(report: Mapping[str, Any]) -> Markup:
    out = []
    for f in report.get("findings", []):
        frames = f.get("evidence", {}).get("frames") if f["code"].startswith("numerics.") else None
        if not frames:
            continue
        rows = [[module_name(fr.get("module", "")), fr.get("max_abs", ""), fr.get("nan", ""),
                 fr.get("inf", ""), fr.get("inputs_finite", "")] for fr in frames[-_MAX_TABLE_ROWS:]]
        where = [Markup("<code>{}</code>").format(f["code"])]
        if f.get("global_step") is not None:
            where.append(Markup("step {}").format(f["global_step"]))
        if f.get("layer") is not None:  # no "layer `None`" heading when no layer was named
            where.append(Markup("layer <code>{}</code>").format(module_name(f["layer"])))
        out.append(Markup("<h2>Frames leading to the first non-finite value ({})</h2>{}").format(
            _join(where, ", "),
            _table(["module (forward order)", "max |x|", "NaN", "Inf", "inputs finite"], rows)))
    return _join(out)


def _finding(f: Mapping[str, Any]) -> Markup:
    where = []
    if f.get("global_step") is not None:
        where.append(Markup("step {}").format(f["global_step"]))
    if f.get("epoch") is not None:
        where.append(Markup("epoch {}").format(f["epoch"]))
    if f.get("layer") is not None:
        where.append(Markup("layer <code>{}</code>").format(module_name(f["layer"])))
    where.append(Markup("rank {}").format(f.get("rank", 0)))
    where.append(Markup("check {}").format(f.get("check", "")))
    explained = f.get("explained_by") or []
    evidence = json.dumps(f.get("evidence", {}), indent=1)
    if len(evidence) > 4000:
        evidence = evidence[:4000] + "\n…"
    return Markup(
        '<div class="finding" style="--c:{color}">{sev} <code><b>{code}</b></code> {title} '
        '<span class="meta">({where})</span>{explained}<p>{message}</p><p><i>Next:</i> {hint}</p>'
        "{trial}<details><summary>evidence</summary><pre>{evidence}</pre></details></div>").format(
        trial=_remedy_html(f) if f.get("remedy") else "",
        color=_SEV_COLOR.get(f["severity"], "#555"), sev=_sev(f["severity"]), code=f["code"],
        title=f["title"], where=_join(where, ", "),
        explained=Markup('<p class="muted">Explained by {}: fix that first.</p>').format(
            ", ".join(explained)) if explained else "",
        message=_md_code(f["message"]), hint=_md_code(trial_hint(f)), evidence=evidence)


def _findings(report: Mapping[str, Any]) -> Markup:
    findings = sorted(report.get("findings", []), key=lambda f: stage_index(f["code"].split(".")[0]))
    return _join(_finding(f) for f in findings) or Markup('<p class="muted">No findings.</p>')


def _run(report: Mapping[str, Any]) -> Markup:
    rows = []
    for key, value in report.get("run", {}).items():
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > 600:
            text = text[:600] + "…"
        rows.append([key, Markup('<span class="mono">{}</span>').format(text)])
    return _table(["setting", "value"], rows)


def _checks(report: Mapping[str, Any]) -> Markup:
    return _table(["check", "status", "detail"], [
        [c["check"], Markup('<b style="color:{}">{}</b>').format(
            _STATUS_COLOR.get(c["status"], "#555"), c["status"]), _md_code(c.get("detail", ""))]
        for c in report.get("checks", [])])


def _section(render: Callable[..., Markup], *args: Any) -> Markup:
    """``render(*args)``, or a note when it fails: one odd section does not cost the page."""
    try:
        return render(*args)
    except Exception as exc:
        return Markup('<p class="muted">This part of the report could not be shown ({}: {}).</p>'
                      ).format(type(exc).__name__, str(exc)[:200])


def render_html(report: Mapping[str, Any], *, plots: bool = True) -> str:
    """Render a report dict as one self-contained HTML page.

    Every string of the report is shown as text; the page carries a Content-Security-Policy
    (:data:`CSP`) that allows no script and no request.

    Args:
        report: the report (as :func:`~lightning_triage.report.build_report` returns it or as
            read back from ``triage_report.json``).
        plots: draw the plots (needs matplotlib; without it, or with ``False``, the data is
            shown as tables).
    """
    run_id = report.get("run", {}).get("run_id")
    marker = Markup('<meta name="lightning-triage-run-id" content="{}">').format(
        marker_id(run_id)) if isinstance(run_id, str) and run_id else ""
    report = visible(report)  # no control, bidi or surrogate character reaches the page
    run = report.get("run", {})
    body = _join([
        _section(_header, report),
        _section(_plots, report, plots),
        Markup("<h2>The protocol, in order</h2>"),
        _section(lambda: _table(["#", "stage", "result", "findings"], _stage_rows(report))),
        _section(_baselines, report),
        _section(_batch_and_frames, report, plots),
        Markup("<h2>Findings ({})</h2>").format(len(report.get("findings", []))),
        _section(_findings, report),
        Markup("<h2>Checks</h2>"), _section(_checks, report),
        Markup("<h2>Run</h2>"), _section(_run, report),
    ])
    return str(Markup(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="{csp}">{run_id}'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>{title}</title><style>{css}</style></head>"
        "<body><main>{body}</main></body></html>\n").format(
        csp=Markup(CSP), run_id=marker, title=f"lightning-triage: {run.get('model', 'run')}",
        css=Markup(_CSS), body=body))


__all__ = ["CSP", "render_html"]
