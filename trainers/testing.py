"""The public kit for algorithm authors: :func:`check_algorithm`.

As :func:`vecaccel.testing.check_backend` is for a backend, :func:`check_algorithm` is what a
third party calls on its own algorithm (bundled or from a plugin) to know that it keeps the
trainers' contract: it trains synchronously and asynchronously, a checkpoint written during a run
resumes bit-identically, it saves and loads in the one checkpoint format, and it predicts. Each
broken property is an ``AssertionError`` whose message says what broke.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["check_algorithm"]


class _Interrupted(Exception):
    """Raised inside an update to stop a run as a crash would."""


def check_algorithm(
    algorithm: str | type[Any],
    /,
    *,
    env_id: str = "CartPole-v1",
    total_timesteps: int = 256,
    checkpoint_every: int = 2,
    context: str = "spawn",
    **config: Any,
) -> None:
    """Check that ``algorithm`` keeps the trainers' contract; raise at the first breach.

    Checked, on the serial backend, CPU, seed 0, one torch thread:

    - it is registered (``vecaccel train NAME``, ``vecaccel eval`` and checkpoint loading find
      it by name) and is an :class:`~vecaccel.trainers.algos.base.Algorithm`;
    - ``learn(total_timesteps)`` collects at least that many env steps, updates, and leaves
      finite parameters; a second run with the same seed ends bit-identical;
    - a run that dies after a periodic checkpoint (every ``checkpoint_every`` updates), loaded
      from its run directory and finished with ``learn()``, ends bit-identical to one never
      interrupted;
    - ``learn(total_timesteps, mode="async", fixed_lag=True)`` trains too, and repeats exactly;
    - ``save`` writes the one checkpoint format (its header names the algorithm), and the agent
      ``load`` gives back has the same config and counters and predicts the same actions.

    It takes seconds to a minute (several short trainings, two with a collector process).

    Args:
        algorithm: the registered name, or the class.
        env_id: the Gymnasium id trained on.
        total_timesteps: the budget of each training (a few batches' worth).
        checkpoint_every: updates between the checkpoints of the resume check.
        context: multiprocessing start method of the asynchronous run's collector process.
        **config: config fields of the algorithm (small networks, batch sizes...).

    Raises:
        AssertionError: naming the property that broke.

    Example:
        >>> from vecaccel.trainers.testing import check_algorithm
        >>> check_algorithm("a2c", total_timesteps=96, num_envs=2, num_steps=8,
        ...                 hidden_sizes=(8,), context="fork")
    """
    import torch

    from vecaccel.trainers.algos.base import Algorithm
    from vecaccel.trainers.checkpoints.format import load_checkpoint
    from vecaccel.trainers.checkpoints.writer import FORMAT, VERSION
    from vecaccel.trainers.config.registry import algorithms

    registered = algorithms()
    if isinstance(algorithm, str):
        assert algorithm in registered, (
            f"no algorithm is registered as {algorithm!r} (registered: {', '.join(registered)}): "
            "register its AlgorithmInfo in a vecaccel_register_algorithms hook"
        )
        cls = registered[algorithm].load_class()
    else:
        cls = algorithm
    assert isinstance(cls, type) and issubclass(cls, Algorithm), (
        f"{cls!r} is not a vecaccel.trainers Algorithm: build it on a family's base "
        "(OnPolicyAlgorithm, OffPolicyAlgorithm)"
    )
    name = cls.algo_name
    assert name in registered and registered[name].load_class() is cls, (
        f"{cls.__name__}.algo_name is {name!r}, which the registry does not map to this class: "
        "checkpoints record algo_name, and vecaccel eval loads them through the registry"
    )
    settings = dict(
        backend="serial",
        seed=0,
        device="cpu",
        torch_threads=1,
        progress=False,
        tensorboard=False,
        **config,
    )

    def parameters(agent: Any) -> list[torch.Tensor]:
        modules = sorted(
            (key, value) for key, value in vars(agent).items() if isinstance(value, torch.nn.Module)
        )
        return [p.detach().clone() for _, module in modules for p in module.state_dict().values()]

    def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)

        # -- synchronous training, repeated ----------------------------------------------------
        runs = []
        for attempt in range(2):
            agent = cls(env_id, run_dir=root / f"sync{attempt}", **settings)
            try:
                agent.learn(total_timesteps)
                assert agent.global_step >= total_timesteps, (
                    f"learn({total_timesteps}) stopped at env step {agent.global_step}"
                )
                assert agent.num_updates > 0, f"learn({total_timesteps}) made no update"
                runs.append(parameters(agent))
            finally:
                agent.close()
        assert all(bool(torch.isfinite(p.float()).all()) for p in runs[0]), (
            "a parameter is not finite after training"
        )
        assert same(runs[0], runs[1]), (
            "two synchronous runs with the same seed ended with different parameters: draw "
            "every random number from the generators the run seeds (torch, NumPy, the config's "
            "seed)"
        )

        # -- a crash after a periodic checkpoint, resumed --------------------------------------
        periodic = dict(settings, checkpoint_every=checkpoint_every)
        uninterrupted = cls(env_id, run_dir=root / "whole", **periodic)
        try:
            uninterrupted.learn(total_timesteps)
            whole = parameters(uninterrupted)
            whole_counters = (uninterrupted.global_step, uninterrupted.num_updates)
        finally:
            uninterrupted.close()
        crash_at = 2 * checkpoint_every
        assert whole_counters[1] > crash_at, (
            f"the resume check needs more than {crash_at} updates; raise total_timesteps"
        )
        update = cls.update

        def update_then_crash(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.num_updates == crash_at:
                raise _Interrupted
            return update(self, *args, **kwargs)

        crashing = cls(env_id, run_dir=root / "crash", **periodic)
        try:
            cls.update = update_then_crash  # type: ignore[method-assign]
            try:
                crashing.learn(total_timesteps)
            except _Interrupted:
                pass
            else:
                raise AssertionError("the run meant to crash ended normally")
        finally:
            cls.update = update  # type: ignore[method-assign]
            crashing.close()
        assert (root / "crash" / "checkpoint.pt").exists(), (
            f"no checkpoint was written in {crash_at} updates with checkpoint_every="
            f"{checkpoint_every}"
        )
        resumed = cls.load(root / "crash", env=env_id, run_dir=root / "crash", **_runtime())
        try:
            resumed.learn()
            assert (resumed.global_step, resumed.num_updates) == whole_counters, (
                f"the resumed run ended at (step, updates) {resumed.global_step, resumed.num_updates}"
                f", the uninterrupted one at {whole_counters}"
            )
            assert same(parameters(resumed), whole), (
                "a run resumed from its periodic checkpoint ended with other parameters than one "
                "never interrupted: the checkpoint section (checkpoint_section/from_checkpoint) "
                "misses some state the run reads"
            )
        finally:
            resumed.close()

        # -- asynchronous training with a fixed lag, repeated ----------------------------------
        async_runs = []
        for attempt in range(2):
            agent = cls(None, env_id=env_id, run_dir=root / f"async{attempt}", **settings)
            try:
                agent.learn(total_timesteps, mode="async", fixed_lag=True, context=context)
                assert agent.global_step >= total_timesteps and agent.num_updates > 0, (
                    f"learn({total_timesteps}, mode='async') stopped at env step "
                    f"{agent.global_step} after {agent.num_updates} updates"
                )
                async_runs.append(parameters(agent))
            finally:
                agent.close()
        assert same(async_runs[0], async_runs[1]), (
            "two asynchronous runs with fixed_lag=True and the same seed ended with different "
            "parameters"
        )

        # -- save, load, predict ---------------------------------------------------------------
        agent = cls(env_id, **settings)
        try:
            agent.learn(total_timesteps)
            path = agent.save(root / "saved.pt")
            state = load_checkpoint(path)
            assert (state.get("format"), state.get("version")) == (FORMAT, VERSION), (
                f"save wrote format {state.get('format')!r} version {state.get('version')!r}, "
                f"not {FORMAT!r} version {VERSION}"
            )
            assert state["algorithm"] == name and cls.checkpoint_key in state, (
                f"the checkpoint names algorithm {state['algorithm']!r} and holds sections "
                f"{sorted(state)}: expected {name!r} and {cls.checkpoint_key!r}"
            )
            loaded = cls.load(path, **_runtime())
            try:
                assert (loaded.global_step, loaded.num_updates) == (
                    agent.global_step,
                    agent.num_updates,
                ), "the loaded agent's counters differ from the saved one's"
                assert loaded.config == agent.config, (
                    f"the loaded config differs from the saved one: {loaded.config} != "
                    f"{agent.config}"
                )
                space = agent.observation_space
                space.seed(0)
                obs = np.stack([space.sample() for _ in range(8)])
                actions, _ = agent.predict(obs, deterministic=True)
                again, _ = loaded.predict(obs, deterministic=True)
                assert np.array_equal(actions, again), (
                    "the loaded agent predicts other actions than the saved one"
                )
                assert len(actions) == len(obs), "predict returned one action per observation"
            finally:
                loaded.close()
        finally:
            agent.close()


def _runtime() -> dict[str, Any]:
    """What a loaded agent in these checks is told beyond its checkpoint."""
    return dict(progress=False, tensorboard=False)
