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
