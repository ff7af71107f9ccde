"""A complete, runnable example of lightning-triage: a small classifier and its DataModule on
scikit-learn's digits (offline), trained with ``Triage()`` by a plain script (``train.py``) or
by LightningCLI (``train_cli.py`` with ``config.yaml`` and ``configs/triage.yaml``).

Run from the repository root: ``python -m examples.train`` or ``python -m examples.train_cli
fit --config examples/config.yaml --config configs/triage.yaml``.
"""
