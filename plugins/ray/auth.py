"""Joining a Ray cluster as Ray's own clients do, with its token when it asks for one, and
failing in bounded time with an error that says what to do.

Ray (2.5x and later) clusters may require token authentication. Ray's command-line tools find
the token in ``RAY_AUTH_TOKEN``, in the file ``RAY_AUTH_TOKEN_PATH`` names, or in
``~/.ray/auth_token``; but ``ray.init(address=...)`` only sends it when ``RAY_AUTH_MODE=token``
is set, and a refused client retries for about 20 seconds before a bare ``ConnectionError``.
So the cluster is asked first, with one cheap call (its cluster id) bounded by
``connect_timeout_s``: it answers, or refuses for authentication, or does not answer at all.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vecaccel.errors import WorkerError

__all__ = [
    "AUTH_MODE_VAR",
    "RayConnectionError",
    "Token",
    "find_token",
    "has_grpc",
    "probe_cluster",
    "wait_reachable",
]

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
#: the GCS call asked of a cluster: cheap, answered by every Ray 2.x head, authenticated
_CLUSTER_ID_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"

HOW_TO_JOIN = (
    "copy the cluster's token (print it on the head node with `ray get-auth-token`) to "
    "~/.ray/auth_token on this machine, or put it in the RAY_AUTH_TOKEN variable (or the "
    "file RAY_AUTH_TOKEN_PATH names), and set RAY_AUTH_MODE=token"
)


class RayConnectionError(WorkerError, ConnectionError):
    """The Ray cluster at ``address`` could not be joined: it did not answer within
    ``connect_timeout_s``, or refused this client's authentication.

    Both a :class:`vecaccel.WorkerError` (the shards could not start) and a ``ConnectionError``.

    Attributes:
        address: the address as given.
        reason: ``"timeout"``, ``"authentication"`` or ``"refused"``.
    """

    def __init__(self, message: str, *, address: str, reason: str) -> None:
        super().__init__(message)
        self.address = address
        self.reason = reason

    def __reduce__(self):
        return (_rebuild, (str(self), self.address, self.reason))


def _rebuild(message: str, address: str, reason: str) -> RayConnectionError:
    return RayConnectionError(message, address=address, reason=reason)


@dataclass(frozen=True)
class Token:
    """A Ray authentication token and where it was found (for messages; never its value)."""

    value: str = ""
    source: str = ""

    def __repr__(self) -> str:
        return f"Token(source={self.source!r})"


def find_token() -> Token | None:
    """The token Ray's own clients would send, looked up as they do: ``RAY_AUTH_TOKEN``, then
    the file ``RAY_AUTH_TOKEN_PATH`` names, then ``~/.ray/auth_token``; ``None`` if none."""
    value = os.environ.get(TOKEN_VAR, "").strip()
    if value:
        return Token(value, TOKEN_VAR)
    named = os.environ.get(TOKEN_PATH_VAR)
    path = Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return Token(value, str(path)) if value else None


def gcs_address(address: str) -> str | None:
    """The ``host:port`` of the cluster's GCS for ``address``, or ``None`` where this cannot be
    told before Ray (a ``ray://`` client address).

    Example:
        >>> gcs_address("127.0.0.1:6379"), gcs_address("ray://head:10001")
        ('127.0.0.1:6379', None)
    """
    if "://" in address:
        return None
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        return get_ray_address_from_environment("auto", None)
    return address


def has_grpc() -> bool:
    """Whether gRPC's Python package is here (the ``ray`` extra installs it; Ray itself only
    needs it for some of its parts)."""
    import importlib.util

    return importlib.util.find_spec("grpc") is not None


def wait_reachable(address: str, target: str, timeout_s: float) -> None:
    """Wait until something accepts a connection at ``target`` (``host:port``); raise
    :class:`RayConnectionError` naming ``address`` after ``timeout_s``."""
    import socket

    host, _, port = target.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(left, 1.0)):
                return
        except OSError:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    raise RayConnectionError(
        f"nothing answered at {address} within connect_timeout_s={timeout_s}: check the "
        "address (the head's GCS port, 6379 by default; Ray Client's, 10001) and that this "
        "machine can reach it, or raise connect_timeout_s",
        address=address,
        reason="timeout",
    )


def probe_cluster(address: str, gcs: str, timeout_s: float, token: Token | None) -> str:
    """Ask the GCS at ``gcs`` for its cluster id within ``timeout_s`` seconds, with ``token``.

    Returns ``"ok"``, or ``"authentication"`` when the cluster refused the call for its token
    (missing or wrong). Raises :class:`RayConnectionError` when nothing answered in time, or
    what answered is not a Ray cluster's GCS.
    """
    import grpc  # type: ignore[import-untyped]

    metadata = () if token is None else (("authorization", f"Bearer {token.value}"),)
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(gcs) as channel:
        call = channel.unary_unary(
            _CLUSTER_ID_METHOD,
            request_serializer=lambda _: b"",  # GetClusterIdRequest has no fields
            response_deserializer=lambda data: data,
        )
        # wait_for_ready: keep trying while the head is still coming up, until the deadline
        future = call.future(None, timeout=timeout_s, metadata=metadata, wait_for_ready=True)
        try:
            # short waits keep Ctrl-C prompt: a signal is handled between them
            while not future.done() and time.monotonic() < deadline + 1.0:
                time.sleep(0.05)
            future.result(timeout=0.5)
        except grpc.FutureTimeoutError:
            future.cancel()
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, ""
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
        except BaseException:
            future.cancel()
            raise
        else:
            return "ok"
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return "authentication"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        raise RayConnectionError(
            f"no Ray cluster answered at {address} within connect_timeout_s={timeout_s}: check "
            "the address (`ray start --head` prints it; the GCS port, 6379 by default) and that "
            "this machine can reach it, or raise connect_timeout_s",
            address=address,
            reason="timeout",
        )
    raise RayConnectionError(
        f"{address} did not answer as a Ray cluster's head ({code.name}: {details}); the "
        "address is the head node's GCS address, `host:6379` by default, or `ray://host:10001` "
        "for Ray Client",
        address=address,
        reason="refused",
    )


def refused_message(address: str, token: Token | None) -> str:
    """What to tell a user whose client the cluster at ``address`` refused for its token."""
    if token is None:
        return (
            f"the Ray cluster at {address} requires token authentication and no token was "
            f"found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token): {HOW_TO_JOIN}"
        )
    return (
        f"the Ray cluster at {address} refused the token from {token.source}: it is not "
        f"this cluster's token; {HOW_TO_JOIN}"
    )


def auth_mode_set() -> str | None:
    """``RAY_AUTH_MODE`` as the user set it (lower case), or ``None``."""
    value = os.environ.get(AUTH_MODE_VAR)
    return None if value is None else value.strip().lower()


def refresh_ray_config(ray: Any) -> None:
    """Make this process's Ray see changed ``RAY_AUTH_*`` variables: Ray caches its config and
    the token it loaded (as Ray itself does when it turns token mode on)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # a Ray without token authentication
        return
