"""A small LightningModule and LightningDataModule: scikit-learn's digits (8x8 images of the
digits 0-9, shipped with scikit-learn, no download) and a 64-32-10 MLP.

They live in the package (:mod:`lightning_triage.demo.digits`, so that the quick start runs from
an installed wheel); the scripts of ``examples/`` import them from here.
"""

from __future__ import annotations

from lightning_triage.demo.digits import DigitsClassifier, DigitsDataModule

__all__ = ["DigitsClassifier", "DigitsDataModule"]
