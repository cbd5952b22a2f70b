"""``vecaccel eval``: play a saved agent's episodes, without the training-only wrappers.

A PettingZoo env (a module path with ``parallel_env``) is played as it was trained: the one
shared policy acts for every live agent, and the report gives each agent's return and the team
return (the sum over the agents) per episode.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from vecaccel.trainers.checkpoints.format import checkpoint_file
from vecaccel.trainers.cli.errors import (
    missing_dependency,
    read_checkpoint,
    setup_errors,
    usage_error,
)
from vecaccel.trainers.config.registry import algorithms
from vecaccel.trainers.services.video import (
    prepare_video_recording,
    to_video_frame,
    write_video,
)

__all__ = [
    "DEFAULT_EVAL_EPSILON",
    "AgentReturns",
    "acting_mode",
    "eval_command",
    "evaluate_agent",
    "evaluate_agents",
    "probability",
]

#: The DQN family's ε of ``--stochastic`` for an agent whose ``eval_epsilon`` is 0: Nature
#: DQN's evaluation ε, and SB3's final exploration rate.
DEFAULT_EVAL_EPSILON = 0.05


def probability(text: str) -> float:
    """argparse type: a number from 0 to 1, or a message saying what the text is not."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {value}")
    return value


def acting_mode(agent: Any, stochastic: bool, epsilon: float | None = None) -> str:
    """Set how ``agent`` acts in evaluation and say it in words.

    With ``stochastic``, A2C and PPO sample from their policy; the DQN family acts ε-greedily
    (``predict(deterministic=False)``) with ``epsilon``, else its ``eval_epsilon``, else
    :data:`DEFAULT_EVAL_EPSILON` where that is 0 (a greedy "sample" would be no sample).
    """
    if not stochastic:
        return "deterministic"
    if not hasattr(agent.config, "eval_epsilon"):
        return "stochastic: actions sampled from the policy"
    if epsilon is None:
        epsilon = agent.config.eval_epsilon or DEFAULT_EVAL_EPSILON
    agent.config.eval_epsilon = float(epsilon)
    return f"stochastic: ε-greedy, ε={epsilon:g}"


def eval_command(args: argparse.Namespace) -> int:
    """Handle ``vecaccel eval CHECKPOINT``; returns the exit code."""
    try:
        import torch  # noqa: F401 - checkpoints are torch files, the agents torch modules
    except ImportError as exc:
        print(missing_dependency("vecaccel eval", exc), file=sys.stderr)
        return 2
    path = checkpoint_file(args.checkpoint)
    state = read_checkpoint(path)
    if state is None:
        return 2
    algo = state["algorithm"]
    registered = algorithms()
    if algo not in registered:
        print(
            f"error: {path} holds no known algorithm (algo={algo!r}; known: "
            f"{', '.join(registered)})",
            file=sys.stderr,
        )
        return 2
    cls = registered[algo].load_class()
    try:
        agent = cls.load(path, device=args.device)
    except setup_errors() as exc:
        return usage_error(exc)
    config = state.get("config", {})
    env_id = args.env or config.get("env_id")
    if env_id is None:
        print("error: the checkpoint names no env; pass --env", file=sys.stderr)
        return 2
    from vecaccel.envs.source import EnvSource
    from vecaccel.trainers.checkpoints.format import check_env_matches
    from vecaccel.trainers.envs.make import make_env_fn, parallel_env_spaces

    try:
        # a MuJoCo run evaluated where mujoco is missing: the extra, before any env is made
        EnvSource.check_id(env_id)
    except setup_errors() as exc:
        return usage_error(exc)
    multi_agent = EnvSource.is_module_path(env_id)
    if args.video is not None:
        # before the env check below makes the first env: MuJoCo reads MUJOCO_GL when it loads
        try:
            prepare_video_recording(env_id)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    try:
        if multi_agent:
            spaces = parallel_env_spaces(env_id)
            check_env_matches(env_id, *spaces, agent.observation_space, agent.action_space)
        else:
            env = make_env_fn(env_id, config.get("atari"), training=False)()
            try:
                check_env_matches(
                    env_id,
                    env.observation_space,
                    env.action_space,
                    agent.observation_space,
                    agent.action_space,
                )
            finally:
                env.close()
    except setup_errors() as exc:
        return usage_error(exc)
    mode = acting_mode(agent, args.stochastic, args.epsilon)
    if multi_agent:
        return _report_agents(agent, algo, env_id, args, mode)
    try:
        returns, lengths = evaluate_agent(
            agent,
            env_id,
            episodes=args.episodes,
            seed=args.seed,
            deterministic=not args.stochastic,
            atari=config.get("atari"),
            video=args.video,
        )
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    import numpy as np

    print(
        f"{algo} on {env_id}: {len(returns)} episodes, return {np.mean(returns):.2f} "
        f"+- {np.std(returns):.2f} (min {np.min(returns):.2f}, max {np.max(returns):.2f}), "
        f"mean length {np.mean(lengths):.1f} ({mode})"
    )
    if args.video is not None:
        print(f"video: {args.video}")
    return 0


class AgentReturns(NamedTuple):
    """What :func:`evaluate_agents` measures, one entry per episode in each list."""

    team: list[float]
    """The sum of every agent's return."""
    agents: dict[str, list[float]]
    """Each agent's own return, by agent name (in the env source's ``agents`` order)."""
    lengths: list[int]
    """Env steps until every agent was done."""


def evaluate_agents(
    agent: Any,
    env_id: str,
    episodes: int = 10,
    seed: int = 0,
    deterministic: bool = True,
    video: Path | None = None,
) -> AgentReturns:
    """Play ``episodes`` episodes of the PettingZoo env ``env_id`` (``parallel_env()`` of that
    module), ``agent.predict`` acting for every live agent at once.

    Episode ``i`` is reset with ``seed + i``; it ends when no agent is left.
    """
    import numpy as np

    from vecaccel.envs.source import EnvSource

    if video is not None:
        prepare_video_recording(env_id)
    source = EnvSource.resolve(
        env_id, 1, env_kwargs={"render_mode": "rgb_array"} if video else None
    )
    env = source[0]()
    names = list(source.agents)
    result = AgentReturns([], {name: [] for name in names}, [])
    frames: list[Any] = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            totals = dict.fromkeys(names, 0.0)
            length = 0
            while env.agents:
                if video is not None and episode == 0:
                    frames.append(env.render())
                live = [name for name in env.agents if name in obs]
                actions, _ = agent.predict(
                    np.stack([np.asarray(obs[name]) for name in live]),
                    deterministic=deterministic,
                )
                obs, rewards, _, _, _ = env.step(dict(zip(live, actions)))
                for name, reward in rewards.items():
                    totals[name] += float(reward)
                length += 1
            for name in names:
                result.agents[name].append(totals[name])
            result.team.append(sum(totals.values()))
            result.lengths.append(length)
        if video is not None and frames:
            write_video(frames, video, fps=int(env.metadata.get("render_fps", 30) or 30))
    finally:
        env.close()
    return result


def _report_agents(agent: Any, algo: str, env_id: str, args: argparse.Namespace, mode: str) -> int:
    """Print the team return and each agent's return of a PettingZoo env's episodes."""
    import numpy as np

    result = evaluate_agents(
        agent,
        env_id,
        episodes=args.episodes,
        seed=args.seed,
        deterministic=not args.stochastic,
        video=args.video,
    )
    team = result.team
    print(
        f"{algo} on {env_id}: {len(team)} episodes, team return {np.mean(team):.2f} "
        f"+- {np.std(team):.2f} (min {np.min(team):.2f}, max {np.max(team):.2f}), "
        f"mean length {np.mean(result.lengths):.1f} ({mode})"
    )
    for name, returns in result.agents.items():
        print(f"  {name}: return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
    if args.video is not None:
        print(f"video: {args.video}")
    return 0


def evaluate_agent(
    agent: Any,
    env_id: str,
    episodes: int = 10,
    seed: int = 0,
    deterministic: bool = True,
    atari: bool | None = None,
    video: Path | None = None,
) -> tuple[list[float], list[int]]:
    """Play ``episodes`` full episodes with ``agent.predict``; returns (returns, lengths).

    The env is built without the training-only wrappers, so the returns are real scores.
    With ``video``, the first episode's ``rgb_array`` frames are written there by
    :func:`~vecaccel.trainers.services.video.write_video`, which makes any renderer's frames
    (MinAtar's float 10x10 cells included) a watchable RGB video.
    """
    import numpy as np

    from vecaccel.trainers.envs.make import make_env_fn

    if video is not None:
        prepare_video_recording(env_id)
    env = make_env_fn(env_id, atari, training=False, render_mode="rgb_array" if video else None)()
    if video is not None:
        try:
            env.reset(seed=seed)
            with warnings.catch_warnings():
                # Gymnasium's env checker warns on the first render of a float frame (MinAtar)
                # and of an env with no render_fps; write_video converts the one and picks 30
                # frames per second for the other
                warnings.filterwarnings("ignore", ".*RGB-array rendering should return")
                warnings.filterwarnings("ignore", ".*No render fps was declared")
                to_video_frame(env.render())
        except Exception as exc:  # e.g. pygame missing for the classic-control renderers
            env.close()
            raise RuntimeError(f"cannot record a video of {env_id}: {exc}") from exc
    frames: list[np.ndarray] = []
    returns: list[float] = []
    lengths: list[int] = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, length, done = 0.0, 0, False
            while not done:
                if video is not None and episode == 0:
                    frames.append(env.render())
                action, _ = agent.predict(np.asarray(obs), deterministic=deterministic)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                length += 1
                done = bool(terminated or truncated)
            returns.append(total)
            lengths.append(length)
        if video is not None and frames:
            write_video(frames, video, fps=int(env.metadata.get("render_fps", 30) or 30))
    finally:
        env.close()
    return returns, lengths
