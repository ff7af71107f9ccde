"""Shared fixtures: small real Trainers on CPU, one thread, no logger, no progress bar."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _file_system_sharing() -> None:
    # `ddp_spawn` tests send tensors to their workers; sandboxes that cannot resize
    # shared-memory file descriptors (`unable to resize file`) still share through files
    mp.set_sharing_strategy("file_system")


@pytest.fixture(autouse=True)
def _patient_remedy_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    # the remedy trial's wall-clock budget (a 5 s floor) is sized for a free machine; on a loaded
    # runner (two test workers on two cores, a ddp_spawn fit beside) a step can be 10-50x slower
    # and the trial skips for time what the test asserts on. Tests of the budget set their own.
    from lightning_triage.callbacks import _remedy

    monkeypatch.setattr(_remedy, "TIME_FLOOR_S", 60.0)


@pytest.fixture(autouse=True)
def _seeded_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # `seed_everything` leaves `PL_GLOBAL_SEED` set for the rest of the process: fix it per test
    # so the report's `run.unseeded` finding does not depend on the order tests run in (tests
    # of that finding delete it)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden files of printed reports (tests/golden/)")
