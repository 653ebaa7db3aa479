from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray instance for a module's tests (`bench run --ray-address`, `bench sweep
    --ray-address`); the tests skip, saying how to get ray, where it is not installed."""
    ray = pytest.importorskip(
        "ray", reason="ray is not installed: pip install 'servebench[ray]' runs these tests"
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
