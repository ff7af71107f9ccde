"""The HTML report's plots, drawn with matplotlib (the ``report`` extra) as base64 PNG.

Each plot function takes the Figure class and the report and returns a ``data:`` URI, or
``None`` when there is nothing to draw. :func:`draw` runs one with labels as plain text (no
math text, no TeX: a module named ``$x^$`` is a label, not a formula) and reports a failure
instead of raising, so that :mod:`lightning_triage.report.html` can show the plot's table instead.
"""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SEV_COLOR = {"error": "#c0392b", "warning": "#b9770e", "info": "#5d6d7e"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
#: Text drawn as it is written: no TeX, no math text, and tick formatters that do not produce
#: math text (matplotlib's log-axis labels are ``$\mathdefault{10^{35}}$`` otherwise, shown raw
#: once math text is off).
_PLAIN_TEXT = {"text.usetex": False, "text.parse_math": False, "axes.formatter.use_mathtext": False}


def figure_class() -> Any | None:
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        return None
    del matplotlib
    return Figure


def label(text: Any) -> str:
    """Report text for a plot label: control characters (no glyph) removed, cut."""
    return _CONTROL.sub(" ", str(text))[:40]


def draw(plot: Callable[..., str | None], *args: Any) -> tuple[str | None, bool]:
    """Run ``plot`` with labels as plain text (no math text, no TeX): its image (or ``None``
    when it has nothing to draw) and whether it failed."""
    import matplotlib

    try:
        plain: dict[Any, Any] = {k: v for k, v in _PLAIN_TEXT.items() if k in matplotlib.rcParams}
        with matplotlib.rc_context(plain):
            return plot(*args), False
    except Exception:  # a plot must not cost the page: its table stands in
        return None, True


def plain_tick_labels(fig: Any) -> None:
    """Give every log-scaled axis of ``fig`` plain-text tick labels (``1e+35``, ``100``, ``0.01``):
    matplotlib's default log formatter writes math text, which reads as raw TeX when math text
    is off. Which ticks carry a label stays matplotlib's choice."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:.4g}" if super().__call__(x, pos) else ""

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                axis.set_major_formatter(PlainLogFormatter())
                axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


def png(fig: Any) -> str:
    """The figure as a PNG ``data:`` URI: log axes labelled in plain text, and the image widened
    to the text drawn outside the figure (wide tick labels pushing an axis title off the edge)
    rather than the text cut."""
    plain_tick_labels(fig)
    drawn, page = fig.get_tightbbox(), fig.bbox_inches
    cut = drawn.x0 < 0 or drawn.y0 < 0 or drawn.x1 > page.x1 or drawn.y1 > page.y1
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, **({"bbox_inches": "tight", "pad_inches": 0.05} if cut else {}))
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


#: What a plot draws at most, whatever a report holds: a little above the largest the library
#: writes (1000 points a series, 40 layers by 128 steps, 8 examples of at most 32 pixels a
#: side, 12 marked steps), so a small hand-made report costs no more than the largest real one.
MAX_POINTS = 5000
MAX_LAYERS = 64
MAX_STEPS = 256
MAX_EXAMPLES = 16
MAX_SIDE = 64
MAX_CODES = 6
#: Most vertical marks (gradient spikes) a plot draws: evenly picked beyond.
MAX_MARKS = 40


def evenly(items: Sequence[Any], k: int) -> list[Any]:
    """At most ``k`` of ``items``, evenly spaced, the first and last kept."""
    n = len(items)
    if n <= k:
        return list(items)
    return [items[round(i * (n - 1) / (k - 1))] for i in range(k)]


def finite_points(points: Sequence[Sequence[Any]]) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for step, value in evenly(points, MAX_POINTS):
        if value is not None and math.isfinite(float(value)):
            xs.append(float(step))
            ys.append(float(value))
    return xs, ys


def chance_level(report: Mapping[str, Any]) -> float | None:
    details = report.get("details", {}) or {}
    for source in (details.get("chance"), details.get("initial_loss")):
        if isinstance(source, Mapping) and isinstance(source.get("chance"), (int, float)):
            return float(source["chance"])
    return None


# ---------------------------------------------------------------------------- plots
def loss_plot(figure_cls: Any, report: Mapping[str, Any]) -> str | None:
    series = report.get("series", {})
    train, val = series.get("train_loss") or [], series.get("val_loss") or []
    if not train and not val:
        return None
    fig = figure_cls(figsize=(5.6, 3.2))
    ax = fig.add_subplot()
    tx, ty = finite_points(train)
    vx, vy = finite_points(val)
    if tx:
        ax.plot(tx, ty, lw=1.2, color="#2e86c1", label="train loss")
    if vx:
        ax.plot(vx, vy, "o-", lw=1.2, ms=3, color="#d35400", label="val loss")
    chance = chance_level(report)
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
        color = SEV_COLOR["error" if any(f["severity"] == "error" for f in found) else "warning"]
        ax.axvline(step, color=color, lw=0.9, alpha=0.8)
        codes = list(dict.fromkeys(label(f["code"]) for f in found))
        more = f"\n+{len(codes) - MAX_CODES}" if len(codes) > MAX_CODES else ""
        ax.annotate("\n".join(codes[:MAX_CODES]) + more, (step, 0.98),
                    xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                    fontsize=7, color=color)
    ax.set_xlabel("global step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    ax.set_title(f"loss curve: {curve_verdict(report)}", fontsize=10)
    fig.subplots_adjust(left=0.15, right=0.97, top=0.9, bottom=0.3)
    return png(fig)


def curve_verdict(report: Mapping[str, Any]) -> str:
    codes = [f["code"] for f in report.get("findings", []) if f["code"].startswith("curve.")]
    return ", ".join(dict.fromkeys(codes)) if codes else "no curve finding"


def grad_plot(figure_cls: Any, report: Mapping[str, Any]) -> str | None:
    layers = (report.get("details", {}) or {}).get("grad_layers") or {}
    norms, names = layers.get("norms") or [], layers.get("layers") or []
    steps = layers.get("steps") or []
    spikes = sorted({int(f["global_step"]) for f in report.get("findings", [])
                     if f["code"] in ("grad.spike", "grad.exploding") and f.get("global_step") is not None})
    spikes = evenly(spikes, MAX_MARKS)  # a bounded drawing, however many spikes
    if norms and names and len(norms) == len(steps) and len(names) <= MAX_LAYERS:
        import numpy as np

        picked = evenly(range(len(steps)), MAX_STEPS)
        steps, norms = [steps[i] for i in picked], [norms[i] for i in picked]
        mat = np.array([[np.nan if v is None else float(v) for v in row[:len(names)]]
                        for row in norms]).T
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
        ax.set_yticklabels([label(n if len(n) <= 28 else "…" + n[-27:]) for n in names],
                           fontsize=7)
        for s in spikes:
            ax.axvline(s, color="#e74c3c", lw=1.2, ls="--")
        ax.set_xlabel("global step" + ("  (red: gradient spikes/explosions)" if spikes else ""))
        fig.colorbar(im, ax=ax, label="log10 grad norm", pad=0.01)
        ax.set_title("per-layer gradient norms", fontsize=10)
        fig.subplots_adjust(left=0.2, right=0.98, top=1 - 0.3 / height, bottom=0.55 / height)
        return png(fig)
    xs, ys = finite_points(report.get("series", {}).get("grad_norm") or [])
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
    return png(fig)


def initial_loss(report: Mapping[str, Any]) -> dict[str, Any] | None:
    info = (report.get("details", {}) or {}).get("initial_loss")
    if isinstance(info, Mapping) and isinstance(info.get("loss"), (int, float)):
        return dict(info)
    for f in report.get("findings", []):
        ev = f.get("evidence", {})
        if f["code"].startswith("init.loss_") and isinstance(ev.get("loss"), (int, float)):
            return {"loss": ev["loss"], "chance": ev.get("chance")}
    return None


def init_plot(figure_cls: Any, report: Mapping[str, Any]) -> str | None:
    info = initial_loss(report) or {}
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
    return png(fig)


def remedy_trial(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The remedy block of the first finding whose trial replayed steps both ways (``None``:
    none did)."""
    for f in report.get("findings", [])[:MAX_POINTS]:
        remedy = f.get("remedy") if isinstance(f, Mapping) else None
        if not isinstance(remedy, Mapping):
            continue
        before, after = remedy.get("before"), remedy.get("after")
        if isinstance(before, Mapping) and isinstance(after, Mapping) \
                and isinstance(before.get("losses"), list) and isinstance(after.get("losses"), list):
            return remedy
    return None


def _replay_points(losses: Sequence[Any]) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for i, v in enumerate(losses[:MAX_STEPS]):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            xs.append(i)
            ys.append(float(v))
    return xs, ys


def remedy_plot(figure_cls: Any, report: Mapping[str, Any]) -> str | None:
    """The replayed steps' training loss, as they were and with the remedy (at most
    :data:`MAX_STEPS` steps each); a replay that went non-finite ends with an x."""
    remedy = remedy_trial(report)
    if remedy is None:
        return None
    lines = []
    for key, name, color in (("before", "as is", "#c0392b"), ("after", "remedied", "#27ae60")):
        losses = remedy[key]["losses"]
        xs, ys = _replay_points(losses)
        broke = next((i for i, v in enumerate(losses[:MAX_STEPS]) if v is None), None)
        lines.append((xs, ys, name, color, broke))
    if not any(ys for _, ys, _, _, _ in lines):
        return None
    fig = figure_cls(figsize=(3.6, 3.2))
    ax = fig.add_subplot()
    values = [v for _, ys, _, _, _ in lines for v in ys]
    for xs, ys, name, color, broke in lines:
        ax.plot(xs, ys, color=color, lw=1.4, label=name)
        if broke is not None and ys:
            ax.plot([xs[-1]], [ys[-1]], "x", color=color, ms=8)
    if min(values) > 0 and max(values) / min(values) > 100:
        ax.set_yscale("log")
    ax.set_xlabel("replayed step", fontsize=9)
    ax.set_ylabel("training loss", fontsize=9)
    ax.set_title(label(f"remedy on a copy: {remedy.get('verdict', '')}"), fontsize=10)
    ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.18, right=0.96, top=0.88, bottom=0.15)
    return png(fig)


def batch_images(figure_cls: Any, batch: Mapping[str, Any]) -> str | None:
    import numpy as np

    kind = batch.get("kind")
    if kind == "image":
        images = [np.asarray(ex, dtype=float) for ex in batch.get("examples", [])[:MAX_EXAMPLES]]
    elif kind == "table" and batch.get("image_shape") and batch.get("pixels"):
        h, w = batch["image_shape"]
        if not (0 < h <= MAX_SIDE and 0 < w <= MAX_SIDE):
            return None
        images = [np.asarray(row, dtype=float).reshape(1, h, w)
                  for row in batch["pixels"][:MAX_EXAMPLES]]
    else:
        return None
    if not images or any(img.ndim != 3 or not 0 < img.shape[0] <= 4 or img.shape[1] > MAX_SIDE
                         or img.shape[2] > MAX_SIDE for img in images):
        return None  # not a picture the library writes: the table shows it
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
            ax.text(i * (w + 1) + w / 2, -0.6, label(f"y={targets[i]}"), ha="center", va="bottom",
                    fontsize=8)
    return png(fig)


__all__ = ["SEV_COLOR", "batch_images", "chance_level", "curve_verdict", "draw", "figure_class",
           "grad_plot", "init_plot", "initial_loss", "loss_plot"]
