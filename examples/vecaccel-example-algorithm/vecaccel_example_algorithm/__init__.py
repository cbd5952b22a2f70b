"""An example third-party vecaccel algorithm: REINFORCE with a learned baseline.

Installing this package registers the algorithm ``reinforce`` through the entry point of
``pyproject.toml`` (group ``vecaccel``): ``vecaccel train reinforce --env CartPole-v1`` trains it,
``vecaccel eval`` plays its checkpoints, and ``Reinforce.load`` reads them. The hook below names
the class by module path, so listing the algorithms (``vecaccel --help``) imports no torch.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from vecaccel import hookimpl

__all__ = ["vecaccel_register_algorithms"]


@hookimpl
def vecaccel_register_algorithms(registry: MutableMapping[str, Any]) -> None:
    """Register ``reinforce``."""
    from vecaccel.trainers.config.registry import AlgorithmInfo

    registry["reinforce"] = AlgorithmInfo(
        "reinforce",
        "vecaccel_example_algorithm.reinforce:Reinforce",
        "vecaccel_example_algorithm.reinforce:ReinforceConfig",
        "REINFORCE with a learned baseline (an example plugin)",
    )
