"""Test scheduling: every multi-process (``slow``) test joins one pytest-xdist group, so that
under ``--dist loadgroup`` they run one at a time on a single worker (they launch ranks of their
own and check timeouts) while the other workers run the single-process tests beside them."""

from __future__ import annotations

import pytest

SLOW_GROUP = "multi-process"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group(SLOW_GROUP))
