import pytest

from cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(request):
    """A 2-node cluster with 4 simulated GPUs per node, on the module's own loopback addresses."""
    base = getattr(request.module, "BASE_ADDRESS")
    c = LocalCluster(base, node_timeout=getattr(request.module, "NODE_TIMEOUT", 6.0)).up()
    yield c
    c.down()
