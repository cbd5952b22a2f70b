"""Backend ``action_server``: workers only simulate; the policy runs batched in the parent.

The class lives in :mod:`vecaccel.plugins.torch_server`, imported when an env is made, so that
building the plugin manager (in every process that calls ``make_vec``, spawned workers
included) never imports torch.
"""

from __future__ import annotations

from typing import Any

from vecaccel import hookimpl


def make_action_server(env_fns, **options: Any):
    from vecaccel.plugins.torch_server import ActionServerVecEnv

    return ActionServerVecEnv(env_fns, **options)


@hookimpl
def vecaccel_register_backends(registry) -> None:
    registry.add(
        "action_server",
        make_action_server,
        "workers only simulate; torch tensors on a device; alternating halves overlap sim and policy",
    )
