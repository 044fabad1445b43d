# pytest configuration for the Python module's tests. The module is found on PYTHONPATH (CTest sets
# it to <build>/python); run by hand as
#   PYTHONPATH=build/python python3 -m pytest tests/python
# and the multi-process files under the launcher:
#   build/tributary-run -n 2 -- python3 -m pytest tests/python/multiprocess
import os

import pytest


def pytest_report_header(config):
    import tributary

    return [f"tributary {tributary.__version__} from {os.path.dirname(tributary.__file__)}, "
            f"backends: {', '.join(tributary.backends())}"]


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(1234)
