"""Joining Ray as users run it: a head node started with ``ray start --head``, with token
authentication on or off, joined by ``make_vec(..., backend="ray", address=...)``.

Each client is its own process with its own temporary ``HOME`` (Ray reads the token from
``~/.ray/auth_token`` and caches it per process), inside the module's loopback-only network
namespace, as are the head nodes (see :func:`tests.support.ray_cluster.ray_start`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vecaccel
from tests.support.ray_cluster import free_port, loopback_ray, ray_start

ray = pytest.importorskip("ray")
from vecaccel.plugins.ray import RayConnectionError  # noqa: E402

#: Ray's token authentication (``RAY_AUTH_MODE``, ``ray get-auth-token``) came with Ray 2.5x
needs_token_auth = pytest.mark.skipif(
    not hasattr(ray._raylet, "AuthenticationTokenLoader"),
    reason=f"Ray {ray.__version__} has no token authentication",
)

#: What a client prints when it joined and stepped; it exits 1 with the error's type and text
#: on stdout when it could not.
CLIENT = textwrap.dedent(
    """
    import sys
    import vecaccel

    address = None if sys.argv[1] == "local" else sys.argv[1]
    try:
        envs = vecaccel.make_vec(
            "CartPole-v1", 2, backend="ray", address=address, num_shards=1, num_workers=1,
            connect_timeout_s=float(sys.argv[2]),
        )
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
        raise SystemExit(1)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    envs.close()
    print("stepped")
    """
)

#: Seconds a client may run: generous, only so that a hung client fails the test.
CLIENT_BOUND_S = 180


@pytest.fixture(scope="module", autouse=True)
def loopback_net():
    with loopback_ray() as isolated:
        yield isolated


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a client process: ``home`` as ``HOME``, no Ray address or
    authentication settings from the environment the tests run in."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("RAY_AUTH") and name != "RAY_ADDRESS"
    }
    return {**env, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", **extra}


def run_client(home: Path, address: str, connect_timeout_s: float = 20, **extra: str):
    return subprocess.run(
        [sys.executable, "-c", CLIENT, address, str(connect_timeout_s)],
        env=client_env(home, **extra),
        capture_output=True,
        text=True,
        timeout=CLIENT_BOUND_S,
    )


def generate_token(home: Path) -> str:
    """``ray get-auth-token --generate`` in ``home``, as a user makes a cluster's token."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run(
        [ray_cli, "get-auth-token", "--generate"],
        env=client_env(home),
        capture_output=True,
        check=True,
        timeout=CLIENT_BOUND_S,
    )
    return (home / ".ray" / "auth_token").read_text().strip()


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    """docs/ray.md's cluster: a head node with token authentication on, and a second node
    joined with the token copied to its home; yields ``(address, home of the head)``."""
    home = tmp_path_factory.mktemp("head_home")
    token = generate_token(home)
    node_home = tmp_path_factory.mktemp("node_home")
    (node_home / ".ray").mkdir()
    (node_home / ".ray" / "auth_token").write_text(token)
    with ray_start({"HOME": str(home), "RAY_AUTH_MODE": "token"}) as address:
        with ray_start({"HOME": str(node_home), "RAY_AUTH_MODE": "token"}, join=address):
            yield address, home


@needs_token_auth
def test_token_cluster_is_joined_with_the_token_ray_finds(token_head, tmp_path):
    """The token in ``~/.ray/auth_token`` (no ``RAY_AUTH_MODE`` set), or in
    ``RAY_AUTH_TOKEN``, is sent to a cluster that asks for one."""
    address, head_home = token_head
    joined = run_client(head_home, address)
    assert joined.returncode == 0 and "stepped" in joined.stdout, joined.stdout + joined.stderr
    assert joined.stderr == "", f"joining a loopback cluster printed: {joined.stderr}"
    token = (head_home / ".ray" / "auth_token").read_text().strip()
    by_variable = run_client(tmp_path, address, RAY_AUTH_TOKEN=token)
    assert by_variable.returncode == 0, by_variable.stdout + by_variable.stderr


@needs_token_auth
def test_token_cluster_refuses_a_client_without_its_token_saying_how_to_fix_it(
    token_head, tmp_path
):
    address, _ = token_head
    refused = run_client(tmp_path, address)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    message = refused.stdout
    assert message.startswith("RayConnectionError: "), message
    assert f"the Ray cluster at {address} requires token authentication" in message
    assert "ray get-auth-token" in message and "RAY_AUTH_MODE=token" in message
    assert "Failed to get cluster ID" not in refused.stderr  # not Ray's retries

    wrong = tmp_path / "wrong"
    (wrong / ".ray").mkdir(parents=True)
    (wrong / ".ray" / "auth_token").write_text("0" * 64)
    refused = run_client(wrong, address)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"refused the token from {wrong / '.ray' / 'auth_token'}" in refused.stdout


@pytest.mark.parametrize("scheme", ["", "ray://"], ids=["gcs", "ray-client"])
def test_an_address_nobody_answers_fails_within_connect_timeout_naming_it(scheme):
    assert not ray.is_initialized()
    address = f"{scheme}127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(RayConnectionError, match=f"answered at {address} within "
                       r"connect_timeout_s=2") as raised:  # fmt: skip
        vecaccel.make_vec("CartPole-v1", 2, backend="ray", address=address, connect_timeout_s=2)
    assert raised.value.address == address and raised.value.reason == "timeout"
    assert isinstance(raised.value, ConnectionError)
    assert not ray.is_initialized()


def test_a_local_run_leaves_home_alone_and_a_later_ray_start_is_still_joinable(tmp_path):
    """A local Ray started by the backend prints nothing and writes no token to the home
    directory, so a plain ``ray start --head`` afterwards runs without token authentication
    and the backend joins it as before."""
    local = run_client(tmp_path, "local")
    assert local.returncode == 0 and local.stdout.strip() == "stepped", local.stdout + local.stderr
    assert local.stderr == "", f"a loopback start printed: {local.stderr}"
    assert not (tmp_path / ".ray").exists(), sorted((tmp_path / ".ray").iterdir())
    with ray_start({"HOME": str(tmp_path)}) as address:
        joined = run_client(tmp_path, address)
    assert joined.returncode == 0 and "stepped" in joined.stdout, joined.stdout + joined.stderr


@needs_token_auth
def test_train_joins_the_token_cluster_with_backend_option_address(token_head, tmp_path):
    """docs/ray.md's last line: ``vecaccel train ... --backend ray --backend-option
    address=...``, the token in the learner's home."""
    pytest.importorskip("torch")
    address, head_home = token_head
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "vecaccel.cli", "train", "ppo", "--env", "CartPole-v1"]
    argv += ["--backend", "ray", "--num-envs", "4", "--num-steps", "8", "--num-workers", "1"]
    argv += ["--backend-option", f"address={address}", "--backend-option", "num_shards=2"]
    argv += ["--no-progress", "--torch-threads", "1", "--no-tensorboard", "--total-timesteps", "32"]
    done = subprocess.run(
        [*argv, "--run-dir", str(run_dir)],
        env=client_env(head_home),
        capture_output=True,
        text=True,
        timeout=CLIENT_BOUND_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (run_dir / "checkpoint.pt").exists()
    assert "Traceback" not in done.stderr and "Failed to" not in done.stderr, done.stderr
