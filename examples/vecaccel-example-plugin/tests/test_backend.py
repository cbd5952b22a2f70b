"""The ``example-threads`` backend keeps vecaccel's vector-env contract.

``vecaccel.testing.check_backend`` runs the contract (trajectories equal to Gymnasium's
``SyncVectorEnv`` in every autoreset mode, seeding, dtypes, copies, action checks,
``call``/``get_attr``/``set_attr``, ``close``) on the backend as a user builds it, by name.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import vecaccel
from vecaccel.testing import check_backend


@pytest.fixture(scope="module", autouse=True)
def example_backend() -> Iterator[None]:
    """The backend comes through its entry point once the package is installed; from a source
    checkout (the package importable, not installed) it is registered here."""
    if "example-threads" in vecaccel.list_backends():
        yield
        return
    import vecaccel_example_plugin

    manager = vecaccel.get_plugin_manager()
    manager.register(vecaccel_example_plugin, name="example")
    yield
    manager.unregister(vecaccel_example_plugin)


@pytest.mark.parametrize(
    "options", [{}, {"num_threads": 2}, {"copy": False}], ids=["default", "two-threads", "views"]
)
def test_example_threads_keeps_the_contract(options: dict) -> None:
    check_backend("example-threads", **options)
