"""Train the digits classifier with ``Triage()`` attached, from a plain script.

Run from the repository root: ``python -m examples.train`` (``--lr 50`` to see a diverging run
diagnosed; ``--help`` for the rest). The report is printed at the end of fit and written to
``--report-dir`` (JSON, Markdown and a self-contained HTML page).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import lightning.pytorch as pl

from examples.digits import DigitsClassifier, DigitsDataModule
from lightning_triage import Triage


def main(argv: Sequence[str] | None = None) -> Triage:
    """Parse the arguments, train, and return the ``Triage`` callback (its ``.report.report``
    holds the report)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop earlier (-1: no limit)")
    parser.add_argument("--report-dir", default="runs/triage", help="where the report goes")
    args = parser.parse_args(argv)
    pl.seed_everything(0)
    triage = Triage(report_dir=args.report_dir)
    trainer = pl.Trainer(max_epochs=args.max_epochs, max_steps=args.max_steps, callbacks=[triage],
                         default_root_dir=args.report_dir, logger=False,
                         enable_checkpointing=False)
    trainer.fit(DigitsClassifier(lr=args.lr), datamodule=DigitsDataModule())
    return triage


if __name__ == "__main__":
    main()
