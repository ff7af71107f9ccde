"""Command line of lightning-triage.

::

    lightning-triage show RUN_DIR_OR_JSON [--fail-on SEVERITY]   print a saved report
    lightning-triage html JSON [-o OUT] [--no-plots]            re-render the HTML page
    lightning-triage diff A B                                    settings and findings, A -> B
    lightning-triage demo [scenario ...]                         the demo runs
    lightning-triage --version

Exit codes: 0 clean; 1 the report (for ``diff``: B, the newer run; for ``demo``: a scenario
not caught) holds findings at or above ``--fail-on`` (default ``error``; ``none``: never 1),
or is the report of an interrupted run (status ``interrupted``: it may miss what the rest of
the run would have found), also for ``html``, after it wrote the page;
2 the command could not do its work: bad arguments, no report there, a file that is not a valid
lightning-triage report or is larger than 64 MiB (one line on stderr says what is wrong), an
output that cannot be written, any unexpected error (one line, never a traceback).
``show``, ``html`` and ``diff`` import neither torch nor Lightning.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

FAIL_CHOICES = ("error", "warning", "info", "none")


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to ``a.b`` keys, and lists of dicts to ``a.0.b`` (other lists stay
    values)."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        for i, v in enumerate(value):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): value}


#: Run keys that change with every run and say nothing about its settings.
_VOLATILE = {"global_step", "epochs", "run_id"}


def diff_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """What changed from report ``a`` to report ``b``: settings (``run``, flattened) and findings
    (codes only in ``a``: gone; only in ``b``: new; in both: kept).

    Example:
        >>> a = {"run": {"lr": 0.1, "seed": 0}, "findings": [{"code": "curve.diverging"}],
        ...      "start_here": "curve.diverging"}
        >>> b = {"run": {"lr": 0.01, "seed": 0}, "findings": [], "start_here": None}
        >>> d = diff_reports(a, b)
        >>> d["settings"], d["gone"], d["new"]
        ({'lr': (0.1, 0.01)}, ['curve.diverging'], [])
    """
    ra = {k: v for k, v in _flat(a.get("run", {})).items() if k not in _VOLATILE}
    rb = {k: v for k, v in _flat(b.get("run", {})).items() if k not in _VOLATILE}
    settings = {k: (ra.get(k), rb.get(k)) for k in sorted(set(ra) | set(rb))
                if ra.get(k) != rb.get(k)}
    ca = list(dict.fromkeys(f["code"] for f in a.get("findings", [])))
    cb = list(dict.fromkeys(f["code"] for f in b.get("findings", [])))
    return {"settings": settings, "gone": [c for c in ca if c not in cb],
            "new": [c for c in cb if c not in ca], "kept": [c for c in cb if c in ca],
            "start_here": (a.get("start_here"), b.get("start_here"))}


def _exit(report: Mapping[str, Any], fail_on: str) -> int:
    from lightning_triage.report.build import problems_at

    if fail_on == "none":
        return 0
    if report.get("status") == "interrupted":  # a gated run that did not end fails the gate
        return 1
    return 1 if problems_at(report, fail_on) else 0  # type: ignore[arg-type]


def _fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    from lightning_triage.report.schema import one_line

    parser.exit(2, f"lightning-triage: error: {one_line(message)}\n")


def _load(source: str, parser: argparse.ArgumentParser) -> tuple[dict[str, Any], Path]:
    from lightning_triage.report.load import find_report, load_report

    try:
        path = find_report(source)
        return load_report(path), path
    except (ValueError, OSError) as exc:  # TriageReportError is a ValueError
        _fail(parser, str(exc))


def _console() -> Any:
    """A rich console whose closed stdout ends the output quietly (rich's own answer to a
    broken pipe is ``SystemExit(1)``, which would read as "findings found")."""
    from rich.console import Console

    class _Quiet(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            _drop_stdout()

    return _Quiet()


def _show(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from lightning_triage.report.console import print_report

    report, path = _load(args.source, parser)
    _output(lambda: print_report(report, console=_console(), path=path))
    return _exit(report, args.fail_on)


def _output(write: Callable[[], None]) -> None:
    """Run ``write`` (printing to stdout); a stdout closed by its reader (``| head``) or not
    open at all is no finding: the rest of the output is dropped and the exit code stays the
    report's."""
    try:
        write()
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, AttributeError) as exc:  # closed file: ValueError
        if isinstance(exc, (ValueError, AttributeError)) and sys.stdout is not None \
                and not sys.stdout.closed:
            raise
        _drop_stdout()
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.EBADF):
            raise
        _drop_stdout()


def _drop_stdout() -> None:
    """Point stdout at the null device: nothing more is written, and the interpreter's flush at
    exit does not fail (Python's advice for ``SIGPIPE``)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and a.samefile(b))
    except OSError:
        return False


def _html(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from lightning_triage.report.files import HTML_NAME, write_file
    from lightning_triage.report.html import render_html
    from lightning_triage.report.schema import one_line

    report, path = _load(args.source, parser)
    out = Path(args.output) if args.output else path.with_name(HTML_NAME)
    if _same_file(path, out):
        _fail(parser, f"refusing to write the HTML over its input {path}: pass another -o")
    replaced = ("the symlink" if out.is_symlink() else "the file" if out.exists() else None)
    try:
        write_file(out, render_html(report, plots=not args.no_plots))
    except OSError as exc:
        _fail(parser, f"cannot write {out}: {exc}")
    if replaced:  # a symlink is replaced by the page; the file it pointed to is untouched
        print(f"lightning-triage: replaced {replaced} {one_line(str(out))}", file=sys.stderr)
    _output(lambda: print(one_line(str(out))))
    return _exit(report, args.fail_on)


def _diff(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    a, pa = _load(args.a, parser)
    b, pb = _load(args.b, parser)
    _output(lambda: _print_diff(diff_reports(a, b), pa, pb))
    return _exit(b, args.fail_on)


def _print_diff(d: Mapping[str, Any], pa: Path, pb: Path) -> None:
    from rich.text import Text

    from lightning_triage.report.text import plain

    console = _console()
    console.print(Text(f"A: {plain(pa, 400)}\nB: {plain(pb, 400)}"))
    console.print(Text("settings changed:", style="bold") if d["settings"] else
                  Text("settings: no change", style="bold"))
    for key, (old, new) in d["settings"].items():
        console.print(Text(f"  {plain(key)}: {plain(repr(old))} -> {plain(repr(new))}"))
    sa, sb = d["start_here"]
    console.print(Text.assemble(("start here: ", "bold"),
                                plain(f"{sa or '-'} -> {sb or '-'}", 500)))
    for label, codes, style in (("new", d["new"], "red"), ("gone", d["gone"], "green"),
                                ("kept", d["kept"], "")):
        if codes:
            console.print(Text.assemble((f"  {label}: ", style or "bold"),
                                        plain(", ".join(codes), 4000)))
    if not (d["new"] or d["gone"] or d["kept"]):
        console.print(Text("  no findings in either run"))


def _demo_epilog() -> str:
    """The demo's scenarios, each with the finding it demonstrates, and where reports go."""
    from lightning_triage.demo import SCENARIOS

    width = max(len(s.name) for s in SCENARIOS)
    lines = [f"  {s.name:<{width}}  {s.expect or 'nothing to fix (healthy)'}" for s in SCENARIOS]
    return ("scenarios (and the finding each demonstrates):\n" + "\n".join(lines) + "\n\n"
            "Each scenario writes triage_report.json, .md and .html to REPORT_ROOT/<scenario>/.")


class _Parser(argparse.ArgumentParser):
    """A parser that builds its epilog only when its help is shown: the demo's scenario list
    imports Lightning, which `show`, `html` and `diff` must not pay for."""

    epilog_factory: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.epilog_factory is not None:
            self.epilog, self.epilog_factory = self.epilog_factory(), None
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-triage", description=(__doc__ or "").replace("\n::\n", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from lightning_triage._version import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    fail_help = ("exit 1 when findings at this severity or worse are present "
                 "(default: error; none: never)")
    show = sub.add_parser("show", help="print a saved report (a JSON file or a run directory)")
    show.add_argument("source", help="triage_report.json or a directory holding one")
    show.add_argument("--fail-on", choices=FAIL_CHOICES, default="error", help=fail_help)
    html = sub.add_parser("html", help="re-render the self-contained HTML report from its JSON "
                                       "(then exit 1 on findings, as show)")
    html.add_argument("source", help="triage_report.json or a directory holding one")
    html.add_argument("-o", "--output", default=None,
                      help="where to write (default: triage_report.html beside the JSON)")
    html.add_argument("--no-plots", action="store_true", help="tables only, no matplotlib")
    html.add_argument("--fail-on", choices=FAIL_CHOICES, default="error", help=fail_help)
    diff = sub.add_parser("diff", help="compare two runs: changed settings and findings")
    diff.add_argument("a", help="the older report (JSON or directory)")
    diff.add_argument("b", help="the newer report (JSON or directory)")
    diff.add_argument("--fail-on", choices=FAIL_CHOICES, default="error",
                      help="exit 1 when B has findings at this severity or worse")
    demo = sub.add_parser("demo", help="train small models on digits and show the diagnoses",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.epilog_factory = _demo_epilog
    demo.add_argument("scenarios", nargs="*", help="scenario names (default: all; listed below)")
    demo.add_argument("--report-root", default=None,
                      help="where to write the reports, one directory per scenario (default: a "
                           "new temporary directory, named at the end)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"show": _show, "html": _html, "diff": _diff}
    if args.command in commands:
        try:
            return commands[args.command](args, parser)
        except (ValueError, OSError, RecursionError, KeyError, TypeError) as exc:
            # a report the validator let through but a command could not use: still one line
            _fail(parser, f"cannot use the report: {type(exc).__name__}: {exc}")
        except Exception as exc:  # anything else (MemoryError ...): 2 and one line, never 1
            _fail(parser, f"unexpected error: {type(exc).__name__}: {exc}")
    try:
        return _demo(args, parser)
    except Exception as exc:  # the demo's training failed: 2 and one line, never 1
        _fail(parser, f"unexpected error: {type(exc).__name__}: {exc}")


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "demo":
        from lightning_triage.demo import SCENARIOS, run_demo

        known = [s.name for s in SCENARIOS]
        unknown = [n for n in args.scenarios if n not in known]
        if unknown:
            _fail(parser, f"unknown scenario(s) {', '.join(map(repr, unknown))}; choose from "
                          f"{', '.join(known)}")
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

        return run_demo(args.scenarios, args.report_root)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
