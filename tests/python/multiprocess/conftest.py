# These tests run under the launcher, one pytest per rank:
#   build/tributary-run -n 2 -- python3 -m pytest tests/python/multiprocess/test_collectives_np.py
# Every rank runs the same tests in the same order (they issue collectives together) and checks its
# own results. Without the launcher they are skipped, with the reason.
import os

import pytest


def pytest_collection_modifyitems(config, items):
    world = int(os.environ.get("TRIBUTARY_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if world < 2:
        skip = pytest.mark.skip(reason="needs several processes: run under tributary-run -n 2")
        for item in items:
            item.add_marker(skip)
