"""Starts the unprivileged rerun of the hostile suites early (see ``tests/envs/unprivileged.py``)."""

from __future__ import annotations

import pytest

from tests.envs import unprivileged

RERUN = pytest.StashKey[unprivileged.Rerun]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Once selection is final: when the unprivileged test is among the items, its rerun starts now."""
    if config.option.collectonly or unprivileged.skip_reason() is not None:
        return
    if any(item.name == unprivileged.TEST_NAME for item in items):
        config.stash[RERUN] = unprivileged.Rerun()


def pytest_unconfigure(config: pytest.Config) -> None:
    rerun = config.stash.get(RERUN, None)
    if rerun is not None:
        rerun.stop()


@pytest.fixture
def unprivileged_rerun(request: pytest.FixtureRequest) -> unprivileged.Rerun:
    """The rerun started at collection (or now, when this test was not in the collected items)."""
    rerun = request.config.stash.get(RERUN, None)
    if rerun is None:
        rerun = request.config.stash[RERUN] = unprivileged.Rerun()
    return rerun
