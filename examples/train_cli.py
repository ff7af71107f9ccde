"""Train the digits classifier with LightningCLI; lightning-triage comes from a config file.

Run from the repository root::

    python -m examples.train_cli fit --config examples/config.yaml --config configs/triage.yaml

``examples/config.yaml`` is a project's own config, with callbacks of its own;
``configs/triage.yaml`` appends ``Triage`` to them (``callbacks+:``), so both are kept.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from examples.digits import DigitsClassifier, DigitsDataModule


def main(args: list[str] | None = None) -> LightningCLI:
    """Run LightningCLI on ``args`` (default: the command line)."""
    return LightningCLI(DigitsClassifier, DigitsDataModule, args=args, save_config_callback=None)


if __name__ == "__main__":
    main()
