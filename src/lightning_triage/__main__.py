"""Command line: ``python -m lightning_triage demo [scenario ...]``."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lightning-triage", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train small models on digits and show the diagnoses")
    demo.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    demo.add_argument("--report-root", default=None, help="where to write the reports")
    args = parser.parse_args(argv)
    if args.command == "demo":
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        from lightning_triage.demo import run_demo

        return run_demo(args.scenarios, args.report_root)
    return 2  # pragma: no cover


if __name__ == "__main__":
    raise SystemExit(main())
