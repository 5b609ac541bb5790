"""A local Ray instance for the executor tests, all of its traffic on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def local_ray_instance(num_cpus: int) -> Iterator[None]:
    """A new instance of our own (`address="local"`), never a cluster left on the machine (RAY_ADDRESS or
    /tmp/ray's record of the last one), which would refuse `num_cpus`."""
    import ray

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus,
             log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
