"""The report as one self-contained HTML page: verdict, protocol checklist, plots, findings.

Rendered from the report dict alone (so ``lightning-triage html report.json`` re-renders a saved
report). The page needs no JavaScript and no network: styles are inline and plots are PNG
images embedded as base64 ``data:`` URIs. Plots need matplotlib (the ``report`` extra:
``pip install "lightning-triage[report]"``); without it the page shows the same data as tables.

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

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_triage.findings import STAGE_QUESTIONS, STAGES, stage_index

_SEV_COLOR = {"error": "#c0392b", "warning": "#b9770e", "info": "#5d6d7e"}
_STATUS_COLOR = {"passed": "#1e8449", "failed": "#c0392b", "skipped": "#7f8c8d",
                 "error": "#8e44ad", "not run": "#7f8c8d"}
_MAX_TABLE_ROWS = 24

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


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _md_code(text: str) -> str:
    """Escape ``text`` and turn its `backtick` spans into ``<code>``."""
    parts = str(text).split("`")
    return "".join(f"<code>{_e(p)}</code>" if i % 2 else _e(p) for i, p in enumerate(parts))


def _sev(severity: str) -> str:
    return f'<span class="sev" style="background:{_SEV_COLOR.get(severity, "#555")}">{_e(severity)}</span>'


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], raw: bool = False) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _e(_fmt(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _matplotlib() -> Any | None:
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        return None
    del matplotlib
    return Figure


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(src: str, caption: str) -> str:
    return (f'<figure><img src="{src}" alt="{_e(caption)}">'
            f"<figcaption>{_md_code(caption)}</figcaption></figure>")


def _finite(points: Sequence[Sequence[Any]]) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for step, value in points:
        if value is not None and math.isfinite(float(value)):
            xs.append(float(step))
            ys.append(float(value))
    return xs, ys


def _chance(report: Mapping[str, Any]) -> float | None:
    details = report.get("details", {}) or {}
    for source in (details.get("chance"), details.get("initial_loss")):
        if isinstance(source, Mapping) and isinstance(source.get("chance"), (int, float)):
            return float(source["chance"])
    return None


# ---------------------------------------------------------------------------- plots
def _loss_plot(figure_cls: Any, report: Mapping[str, Any]) -> str | None:
    series = report.get("series", {})
    train, val = series.get("train_loss") or [], series.get("val_loss") or []
    if not train and not val:
        return None
    fig = figure_cls(figsize=(5.6, 3.2))
    ax = fig.add_subplot()
    tx, ty = _finite(train)
    vx, vy = _finite(val)
    if tx:
        ax.plot(tx, ty, lw=1.2, color="#2e86c1", label="train loss")
    if vx:
        ax.plot(vx, vy, "o-", lw=1.2, ms=3, color="#d35400", label="val loss")
    chance = _chance(report)
    if chance is not None:
        ax.axhline(chance, ls="--", color="#7f8c8d", lw=1, label=f"chance {chance:.3g}")
    ys = ty + vy + ([chance] if chance else [])
    if ys and min(ys) > 0 and max(ys) / min(ys) > 100:
        ax.set_yscale("log")
    marked: dict[int, list[dict[str, Any]]] = {}
    for f in report.get("findings", []):
        step = f.get("global_step")
        if step is None or f["severity"] == "info" or step == 0:
            continue
        marked.setdefault(int(step), []).append(f)
    for step, found in sorted(marked.items())[:12]:
        color = _SEV_COLOR["error" if any(f["severity"] == "error" for f in found) else "warning"]
        ax.axvline(step, color=color, lw=0.9, alpha=0.8)
        ax.annotate("\n".join(dict.fromkeys(f["code"] for f in found)), (step, 0.98),
                    xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                    fontsize=7, color=color)
    ax.set_xlabel("global step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    ax.set_title(f"loss curve: {_curve_verdict(report)}", fontsize=10)
    fig.subplots_adjust(left=0.13, right=0.97, top=0.9, bottom=0.3)
    return _png(fig)


def _curve_verdict(report: Mapping[str, Any]) -> str:
    codes = [f["code"] for f in report.get("findings", []) if f["code"].startswith("curve.")]
    return ", ".join(dict.fromkeys(codes)) if codes else "no curve finding"


def _grad_plot(figure_cls: Any, report: Mapping[str, Any]) -> str | None:
    layers = (report.get("details", {}) or {}).get("grad_layers") or {}
    norms, names = layers.get("norms") or [], layers.get("layers") or []
    steps = layers.get("steps") or []
    spikes = sorted({int(f["global_step"]) for f in report.get("findings", [])
                     if f["code"] in ("grad.spike", "grad.exploding") and f.get("global_step") is not None})
    if norms and names and len(norms) == len(steps):
        import numpy as np

        mat = np.array([[np.nan if v is None else float(v) for v in row] for row in norms]).T
        with np.errstate(divide="ignore", invalid="ignore"):
            logm = np.log10(np.where(mat > 0, mat, np.nan))
        height = min(1.8 + 0.22 * len(names), 6.0)
        fig = figure_cls(figsize=(5.6, height))
        ax = fig.add_subplot()
        finite = logm[np.isfinite(logm)]
        vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (-1.0, 1.0)
        im = ax.imshow(logm, aspect="auto", interpolation="nearest", cmap="viridis",
                       vmin=vmin, vmax=max(vmax, vmin + 1e-6),
                       extent=(steps[0] - 0.5, steps[-1] + 0.5, len(names) - 0.5, -0.5))
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([n if len(n) <= 28 else "…" + n[-27:] for n in names], fontsize=7)
        for s in spikes:
            ax.axvline(s, color="#e74c3c", lw=1.2, ls="--")
        ax.set_xlabel("global step" + ("  (red: gradient spikes/explosions)" if spikes else ""))
        fig.colorbar(im, ax=ax, label="log10 grad norm", pad=0.01)
        ax.set_title("per-layer gradient norms", fontsize=10)
        fig.subplots_adjust(left=0.2, right=0.98, top=1 - 0.3 / height, bottom=0.55 / height)
        return _png(fig)
    xs, ys = _finite(report.get("series", {}).get("grad_norm") or [])
    if not xs:
        return None
    fig = figure_cls(figsize=(5.6, 3.2))
    ax = fig.add_subplot()
    ax.plot(xs, ys, lw=1.1, color="#7d3c98")
    if min(ys) > 0:
        ax.set_yscale("log")
    for s in spikes:
        ax.axvline(s, color="#e74c3c", lw=1.0, ls="--")
    ax.set_xlabel("global step")
    ax.set_ylabel("total grad norm")
    ax.grid(alpha=0.3)
    ax.set_title("gradient norm", fontsize=10)
    fig.subplots_adjust(left=0.15, right=0.97, top=0.9, bottom=0.17)
    return _png(fig)


def _initial_loss(report: Mapping[str, Any]) -> dict[str, Any] | None:
    info = (report.get("details", {}) or {}).get("initial_loss")
    if isinstance(info, Mapping) and isinstance(info.get("loss"), (int, float)):
        return dict(info)
    for f in report.get("findings", []):
        ev = f.get("evidence", {})
        if f["code"].startswith("init.loss_") and isinstance(ev.get("loss"), (int, float)):
            return {"loss": ev["loss"], "chance": ev.get("chance")}
    return None


def _init_plot(figure_cls: Any, info: Mapping[str, Any]) -> str | None:
    loss, chance = info.get("loss"), info.get("chance")
    if not isinstance(loss, (int, float)) or not isinstance(chance, (int, float)) \
            or not math.isfinite(float(loss)):
        return None
    fig = figure_cls(figsize=(2.8, 3.2))
    ax = fig.add_subplot()
    far = chance > 0 and not (chance / 3 <= loss <= chance * 3)
    ax.bar(["step-0 loss", "chance"], [loss, chance],
           color=["#c0392b" if far else "#2e86c1", "#95a5a6"])
    if chance > 0 and loss > 0 and max(loss, chance) / min(loss, chance) > 30:
        ax.set_yscale("log")
    for i, v in enumerate((loss, chance)):
        ax.annotate(f"{v:.4g}", (i, v), ha="center", va="bottom", fontsize=8)
    ax.set_title("step-0 loss vs chance", fontsize=10)
    fig.subplots_adjust(left=0.22, right=0.96, top=0.88, bottom=0.12)
    return _png(fig)


def _batch_images(figure_cls: Any, batch: Mapping[str, Any]) -> str | None:
    import numpy as np

    kind = batch.get("kind")
    if kind == "image":
        images = [np.asarray(ex, dtype=float) for ex in batch.get("examples", [])]
    elif kind == "table" and batch.get("image_shape") and batch.get("pixels"):
        h, w = batch["image_shape"]
        images = [np.asarray(row, dtype=float).reshape(1, h, w) for row in batch["pixels"]]
    else:
        return None
    if not images:
        return None
    targets = batch.get("targets") or []
    n = len(images)
    h = max(img.shape[1] for img in images)
    w = max(img.shape[2] for img in images)
    rgb = all(img.shape[0] == 3 for img in images)
    # one mosaic, one imshow: a subplot per example costs ten times more to draw
    mosaic = np.full((h, n * (w + 1) - 1, 3 if rgb else 1), np.nan)
    for i, img in enumerate(images):
        tile = np.transpose(img, (1, 2, 0)) if rgb else img[:1].transpose(1, 2, 0)
        lo, hi = np.nanmin(tile), np.nanmax(tile)  # each example scaled to its own range
        tile = (tile - lo) / (hi - lo) if hi > lo else np.zeros_like(tile)
        mosaic[: tile.shape[0], i * (w + 1): i * (w + 1) + tile.shape[1]] = tile
    fig = figure_cls(figsize=(min(1.1 * n, 9.6), 1.5))
    ax = fig.add_axes((0.0, 0.0, 1.0, 0.82))
    if rgb:
        ax.imshow(np.nan_to_num(mosaic, nan=1.0), interpolation="nearest")
    else:
        ax.imshow(mosaic[:, :, 0], cmap="gray", interpolation="nearest", vmin=0.0, vmax=1.0)
    ax.set_axis_off()
    for i in range(min(n, len(targets))):
        if not isinstance(targets[i], list):
            ax.text(i * (w + 1) + w / 2, -0.6, f"y={targets[i]}", ha="center", va="bottom",
                    fontsize=8)
    return _png(fig)


def _batch_table(batch: Mapping[str, Any]) -> str:
    examples = batch.get("examples") or []
    targets = batch.get("targets") or []
    rows = []
    for i, ex in enumerate(examples[:_MAX_TABLE_ROWS]):
        flat = _flatten(ex)
        shown = ", ".join(_fmt(v) for v in flat[:16]) + (" …" if len(flat) > 16 else "")
        target = targets[i] if i < len(targets) else ""
        rows.append([i, f'<span class="mono">{_e(shown)}</span>', _e(_fmt(target))])
    return _table(["#", "values (first 16)", "target"], rows, raw=True)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [v for item in value for v in _flatten(item)]
    return [value]


# ---------------------------------------------------------------------------- sections
def _header(report: Mapping[str, Any]) -> str:
    run = report.get("run", {})
    meta = [f"status <b>{_e(report.get('status'))}</b>"]
    for key, label in (("model", "model"), ("global_step", "steps"), ("epochs", "epochs"),
                       ("precision", "precision"), ("strategy", "strategy")):
        if run.get(key) is not None:
            meta.append(f"{label} <b>{_e(run[key])}</b>")
    counts = {s: 0 for s in ("error", "warning", "info")}
    for f in report.get("findings", []):
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    first = report.get("start_here")
    lead = next((f for f in report.get("findings", []) if f["code"] == first), None)
    if lead is not None:
        color = _SEV_COLOR[lead["severity"]]
        where = "" if lead.get("global_step") is None else f" at step {lead['global_step']}"
        if lead.get("layer"):
            where += f", layer <code>{_e(lead['layer'])}</code>"
        verdict = (
            f'<div class="verdict" style="--c:{color}"><div>Verdict: <b>{counts["error"]} error(s), '
            f'{counts["warning"]} warning(s)</b>. Start here: <span class="code">{_e(first)}</span>'
            f"{where}</div>"
            f"<p><b>What:</b> {_e(lead['title'])}.</p>"
            f"<p><b>Why:</b> {_md_code(lead['message'])}</p>"
            f"<p><b>Next:</b> {_md_code(lead['hint'])}</p></div>")
    else:
        verdict = ('<div class="verdict" style="--c:#1e8449"><div><b>Verdict: no problems found.'
                   f'</b> {counts["info"]} info finding(s); every check that ran passed.</div></div>')
    return (f"<h1>lightning-triage report</h1><div class=\"meta\">{' · '.join(meta)}</div>"
            + verdict)


def _stage_rows(report: Mapping[str, Any]) -> list[list[str]]:
    from lightning_triage.callbacks import check_stages  # the checks' declarations (they import us)

    check_stage = check_stages()
    checks = report.get("checks", [])
    findings = report.get("findings", [])
    rows = []
    for i, stage in enumerate(STAGES, 1):
        stage_checks = [c for c in checks if check_stage.get(c["check"]) == stage]
        stage_findings = [f for f in findings if f["code"].split(".")[0] == stage]
        problems = [f for f in stage_findings if f["severity"] != "info"]
        if problems:
            status = "failed"
        elif any(c["status"] == "passed" or c["status"] == "failed" for c in stage_checks):
            status = "passed"
        elif any(c["status"] == "error" for c in stage_checks):
            status = "error"
        elif stage_checks:
            status = "skipped"
        else:
            status = "not run"
        shown = problems or stage_findings
        cells = []
        for f in shown[:4]:
            ev = ", ".join(f"{k}={_fmt(v)}" for k, v in f.get("evidence", {}).items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool))[:160]
            step = "" if f.get("global_step") is None else f" step {f['global_step']}"
            explained = f.get("explained_by") or []
            cells.append(
                f"{_sev(f['severity'])} <code>{_e(f['code'])}</code>{_e(step)} {_e(f['title'])}"
                + (f' <span class="muted">(explained by {_e(", ".join(explained))})</span>'
                   if explained else "")
                + (f'<br><span class="mono muted">{_e(ev)}</span>' if ev else "")
                + (f"<br><i>Hint:</i> {_md_code(f['hint'])}" if f["severity"] != "info" else ""))
        if len(shown) > 4:
            cells.append(f'<span class="muted">and {len(shown) - 4} more below</span>')
        detail = "; ".join(c["detail"] for c in stage_checks if c.get("detail"))
        if not cells and detail:
            cells.append(f'<span class="muted">{_md_code(detail[:300])}</span>')
        color = _STATUS_COLOR[status]
        rows.append([str(i), f"<b>{stage}</b><br><span class=\"muted\">{_e(STAGE_QUESTIONS[stage])}</span>",
                     f'<b style="color:{color}">{status}</b>', "<br>".join(cells)])
    return rows


def _plots(report: Mapping[str, Any], plots: bool) -> str:
    figure_cls = _matplotlib() if plots else None
    parts: list[str] = []
    figures: list[str] = []
    if figure_cls is not None:
        src = _loss_plot(figure_cls, report)
        if src:
            figures.append(_figure(src, "Training and validation loss; dashed: chance level; "
                                        "vertical lines: findings at their steps."))
        src = _grad_plot(figure_cls, report)
        if src:
            figures.append(_figure(src, "Gradient norms over the steps (per layer where "
                                        "recorded; white: zero); red dashed lines: spikes."))
        info = _initial_loss(report)
        src = _init_plot(figure_cls, info) if info else None
        if src:
            figures.append(_figure(src, "Step-0 loss against the chance level: a fresh model "
                                        "should be near chance."))
    else:
        parts.append('<p class="muted">Plots need matplotlib (<code>pip install '
                     '"lightning-triage[report]"</code>); the data is shown as tables.</p>')
        for name in ("train_loss", "val_loss", "grad_norm"):
            points = report.get("series", {}).get(name) or []
            if points:
                idx = _evenly(len(points), _MAX_TABLE_ROWS)
                parts.append(f"<h3>{_e(name)}</h3>" + _table(
                    ["step", "value"], [[points[i][0], "nan/inf" if points[i][1] is None
                                         else points[i][1]] for i in idx]))
        chance = _chance(report)
        if chance is not None:
            parts.append(f"<p>Chance level: <b>{chance:.4g}</b>. Curve: {_e(_curve_verdict(report))}</p>")
        info = _initial_loss(report)
        if info:
            parts.append(_table(["step-0 loss", "chance"], [[info.get("loss"), info.get("chance")]]))
    if figures:
        parts.insert(0, '<div class="grid">' + "".join(figures) + "</div>")
    return "".join(parts)


def _batch_and_frames(report: Mapping[str, Any], plots: bool) -> str:
    figure_cls = _matplotlib() if plots else None
    parts: list[str] = []
    details = report.get("details", {}) or {}
    batch = details.get("first_batch")
    if isinstance(batch, Mapping) and batch.get("examples") is not None:
        shape = "×".join(str(s) for s in batch.get("shape", []))
        title = (f"<h2>First training batch</h2><p class=\"meta\">tensor <code>{_e(batch.get('tensor'))}"
                 f"</code> shape {_e(shape)} {_e(batch.get('dtype', ''))}, step "
                 f"{_e(batch.get('global_step'))}; first {len(batch['examples'])} examples</p>")
        src = _batch_images(figure_cls, batch) if figure_cls is not None else None
        grid = (f'<div class="grid">{_figure(src, "the first examples (targets above)")}</div>'
                if src else "")
        parts.append(title + grid + _batch_table(batch))
    frames = _nan_frames(report)
    if frames:
        parts.append(frames)
    return "".join(parts)


def _evenly(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _nan_frames(report: Mapping[str, Any]) -> str:
    out = []
    for f in report.get("findings", []):
        frames = f.get("evidence", {}).get("frames") if f["code"].startswith("numerics.") else None
        if not frames:
            continue
        rows = [[fr.get("module", ""), fr.get("max_abs", ""), fr.get("nan", ""), fr.get("inf", ""),
                 fr.get("inputs_finite", "")] for fr in frames[-_MAX_TABLE_ROWS:]]
        out.append(f"<h2>Frames leading to the first non-finite value (<code>{_e(f['code'])}</code>, "
                   f"step {_e(f.get('global_step'))}, layer <code>{_e(f.get('layer'))}</code>)</h2>"
                   + _table(["module (forward order)", "max |x|", "NaN", "Inf", "inputs finite"], rows))
    return "".join(out)


def _findings(report: Mapping[str, Any]) -> str:
    out = []
    for f in sorted(report.get("findings", []), key=lambda f: stage_index(f["code"].split(".")[0])):
        where = []
        if f.get("global_step") is not None:
            where.append(f"step {f['global_step']}")
        if f.get("epoch") is not None:
            where.append(f"epoch {f['epoch']}")
        if f.get("layer"):
            where.append(f"layer <code>{_e(f['layer'])}</code>")
        where.append(f"rank {_e(f.get('rank', 0))}")
        where.append(f"check {_e(f.get('check', ''))}")
        explained = f.get("explained_by") or []
        evidence = json.dumps(f.get("evidence", {}), indent=1)
        if len(evidence) > 4000:
            evidence = evidence[:4000] + "\n…"
        out.append(
            f'<div class="finding" style="--c:{_SEV_COLOR.get(f["severity"], "#555")}">'
            f"{_sev(f['severity'])} <code><b>{_e(f['code'])}</b></code> {_e(f['title'])}"
            f' <span class="meta">({", ".join(where)})</span>'
            + (f'<p class="muted">Explained by {_e(", ".join(explained))}: fix that first.</p>'
               if explained else "")
            + f"<p>{_md_code(f['message'])}</p><p><i>Next:</i> {_md_code(f['hint'])}</p>"
            f"<details><summary>evidence</summary><pre>{_e(evidence)}</pre></details></div>")
    return "".join(out) or '<p class="muted">No findings.</p>'


def _run(report: Mapping[str, Any]) -> str:
    rows = []
    for key, value in report.get("run", {}).items():
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > 600:
            text = text[:600] + "…"
        rows.append([key, f'<span class="mono">{_e(text)}</span>'])
    return _table(["setting", "value"], rows, raw=True)


def render_html(report: Mapping[str, Any], *, plots: bool = True) -> str:
    """Render a report dict as one self-contained HTML page.

    Args:
        report: the report (as :func:`~lightning_triage.report.build_report` returns it or as
            read back from ``triage_report.json``).
        plots: draw the plots (needs matplotlib; without it, or with ``False``, the data is
            shown as tables).
    """
    checks_rows = [[c["check"], f'<b style="color:{_STATUS_COLOR.get(c["status"], "#555")}">'
                    f'{_e(c["status"])}</b>', _md_code(c.get("detail", ""))]
                   for c in report.get("checks", [])]
    body = (
        _header(report)
        + _plots(report, plots)
        + "<h2>The protocol, in order</h2>"
        + _table(["#", "stage", "result", "findings"], _stage_rows(report), raw=True)
        + _batch_and_frames(report, plots)
        + f"<h2>Findings ({len(report.get('findings', []))})</h2>" + _findings(report)
        + "<h2>Checks</h2>" + _table(["check", "status", "detail"], checks_rows, raw=True)
        + "<h2>Run</h2>" + _run(report)
    )
    title = f"lightning-triage: {report.get('run', {}).get('model', 'run')}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
            f"<body><main>{body}</main></body></html>\n")


__all__ = ["render_html"]
