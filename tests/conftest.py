"""Shared test configuration: integration tests are marked by folder, so `-m "not integration"` works."""

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    integration = Path(__file__).parent / "integration"
    for item in items:
        if integration in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
