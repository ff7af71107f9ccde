"""A report whose every string (values and keys) holds markup of every output, control
characters, math text, `|` and newlines: nothing of it may be interpreted anywhere."""

from __future__ import annotations

from typing import Any

from tests.report_samples import broken_report

EVIL = ("<script>document.title='PWNED'</script><img src=x onerror=alert(1)> [bold red]x[/bold] "
        "[/] $\\notacommand{x}^$ | cell\n# heading\r\x1b]0;TITLE\x07\x1b[2J `tick **em** "
        "[link](javascript:alert(1)) &amp; ~~s~~ \x00end")


#: :data:`EVIL` with what else a run's objects can be named: bidi overrides and isolates,
#: zero-width characters, C1 controls, a lone surrogate (an undecodable file name's byte).
EVIL_ALL = EVIL + " \u202eevil\u2066x\u200by\ufeff\x85\x9b31m caf\udce9"


def hostile_report(text: str = EVIL) -> dict[str, Any]:
    """The broken sample run with hostile ``text`` in every free-form string and key."""
    EVIL = text  # the same name as the module default, for the lines below
    report = broken_report()
    run = report["run"]
    for key in ("model", "strategy", "precision", "lightning", "torch"):
        run[key] = EVIL
    run[EVIL] = {EVIL: [EVIL]}
    run["hparams"] = {EVIL: EVIL}
    for f in report["findings"]:
        f.update(title=EVIL, message=EVIL + " `code " + EVIL + "`", hint=EVIL, check=EVIL,
                 layer=EVIL)
        f["evidence"][EVIL] = EVIL
        for frame in f["evidence"].get("frames", []):
            frame["module"] = EVIL
    for c in report["checks"]:
        c["detail"] = EVIL
    report["checks"].append({"check": EVIL, "status": "passed", "detail": EVIL})
    report["series"][EVIL] = [[0, 1.0]]
    details = report["details"]
    details["grad_layers"]["layers"] = [EVIL, "$\\notacommand{x}^$"]
    details["first_batch"].update(tensor=EVIL, dtype=EVIL, targets=[EVIL] * 8)
    details[EVIL] = {EVIL: EVIL}
    return report
