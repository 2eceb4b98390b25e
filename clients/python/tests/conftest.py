import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("LEASEHOLD_PY_INSTALLED") != "1":
    # Test the tree's sources unless told to test the installed package.
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from servers import Cluster  # noqa: E402


@pytest.fixture(scope="session")
def single():
    c = Cluster(1).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def trio():
    c = Cluster(3).start()
    yield c
    c.stop()
