"""The ``ray`` backend's Ray: the one this process is connected to, a cluster joined at an
address, or a local one started for this process alone (bound to 127.0.0.1) and stopped when
the last vector env using it closes.

A local Ray started here keeps nothing in the user's home: Ray 2.5x turns token authentication
on for a new local Ray and writes a token to ``~/.ray/auth_token``, which makes every later
``ray start --head`` require that token too. Here the local Ray gets a token made for this
process, passed to Ray's processes through ``RAY_AUTH_TOKEN``, so it is as closed to other
users of the machine and nothing is written.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from .auth import (
    AUTH_MODE_VAR,
    TOKEN_PATH_VAR,
    TOKEN_VAR,
    RayConnectionError,
    auth_mode_set,
    find_token,
    gcs_address,
    has_grpc,
    probe_cluster,
    refresh_ray_config,
    refused_message,
    wait_reachable,
)

__all__ = ["RayRuntime", "is_loopback_address"]

#: what turns Ray's lookup of a routable node address off (see _loopback_node)
_IP_PROBE_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback_address(address: str | None) -> bool:
    """Whether ``address`` (``host:port``, or ``None`` for a local Ray) names this machine's
    loopback.

    Example:
        >>> is_loopback_address("127.0.0.1:6379"), is_loopback_address("10.0.0.2:6379")
        (True, False)
    """
    if address is None:
        return True
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _environ(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or with ``None`` remove) environment variables; put the old ones back on exit."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        _set_environ(values)
        yield
    finally:
        _set_environ(saved)


def _set_environ(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def _loopback_node(ray: Any) -> Iterator[None]:
    """While Ray starts on (or joins) loopback: its node address stays 127.0.0.1.

    Ray replaces a loopback node address by the one it finds by opening a socket towards
    8.8.8.8, and warns when that fails (as it always does where only loopback is up). That
    lookup is skipped where Ray's ``ENABLE_RAY_CLUSTER`` is off, which only decides this.
    """
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is None or not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    saved = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        with _environ({_IP_PROBE_VAR: "0"}):
            yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved


class RayRuntime:
    """Ray as this process found it, or joined or started here and later left or stopped."""

    _lock = threading.Lock()
    _started_here = False
    _users = 0
    #: this process's SIGTERM handler before ``ray.init`` replaced it; put back at shutdown
    _sigterm: Any = None
    #: the ``RAY_AUTH_*`` variables as they were before the local Ray started here set them
    _saved_environ: dict[str, str | None] = {}

    @classmethod
    def acquire(cls, address: str | None, connect_timeout_s: float | None = None) -> None:
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        with cls._lock:
            if ray.is_initialized():
                if cls._started_here:
                    cls._users += 1
                return
            address = address or os.environ.get("RAY_ADDRESS") or None
            main_thread = threading.current_thread() is threading.main_thread()
            cls._sigterm = signal.getsignal(signal.SIGTERM) if main_thread else None
            try:
                settings = (
                    cls._local_auth()
                    if address is None
                    else cls._join_auth(address, connect_timeout_s)
                )
            except KeyboardInterrupt:
                raise KeyboardInterrupt(f"interrupted while joining Ray at {address}") from None
            cls._saved_environ = {name: os.environ.get(name) for name in settings}
            try:
                for name, value in settings.items():
                    os.environ[name] = value
                if settings:
                    refresh_ray_config(ray)
                cls._init(ray, address)
            except BaseException:
                cls._restore_environ(ray)
                raise
            cls._started_here, cls._users = True, 1

    @classmethod
    def _init(cls, ray: Any, address: str | None) -> None:
        """``ray.init``; on Ctrl-C, whatever Ray had started is stopped and the interrupt
        comes back as one line, not Ray's internals' traceback."""
        common = {"include_dashboard": False, "logging_level": "WARNING"}
        loopback = _loopback_node(ray) if is_loopback_address(address) else contextlib.nullcontext()
        before = _ray_children()
        try:
            with loopback, warnings.catch_warnings():
                # Ray's notes to its own users about its future defaults, not actionable here
                warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\.")
                if address is None:
                    # "local": a new Ray, not the last one `ray start` recorded in /tmp/ray
                    ray.init(address="local", _node_ip_address="127.0.0.1", **common)
                else:
                    ray.init(address=address, **common)
        except KeyboardInterrupt:
            # the processes of a Ray that was still starting go at once (Ctrl-C asks to stop,
            # and those started before Ray recorded them would outlive ray.shutdown)
            for pid in _ray_children() - before:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(BaseException):
                ray.shutdown()
            where = "starting a local Ray" if address is None else f"joining Ray at {address}"
            raise KeyboardInterrupt(f"interrupted while {where}") from None

    @staticmethod
    def _local_auth() -> dict[str, str]:
        """The ``RAY_AUTH_*`` settings of a local Ray started here (see the module's text)."""
        mode = auth_mode_set()
        if mode == "disabled":  # the user's choice: Ray then neither warns nor writes
            return {}
        settings = {AUTH_MODE_VAR: "token"}
        if not (os.environ.get(TOKEN_VAR) or os.environ.get(TOKEN_PATH_VAR)):
            settings[TOKEN_VAR] = secrets.token_hex(32)
        return settings

    @staticmethod
    def _join_auth(address: str, connect_timeout_s: float | None) -> dict[str, str]:
        """Ask the cluster at ``address`` whether it answers, and with which token; the
        ``RAY_AUTH_*`` settings that let ``ray.init`` join it."""
        if connect_timeout_s is None:
            return {}
        gcs = gcs_address(address)
        if gcs is None or not has_grpc():
            # Ray Client's server, or no gRPC to ask a GCS with: a connection is all that is
            # asked for, and the token is Ray's to send (RAY_AUTH_MODE=token)
            wait_reachable(address, gcs or address.split("://", 1)[1], connect_timeout_s)
            return {}
        mode = auth_mode_set()
        token = None if mode == "disabled" else find_token()
        sent = token if mode == "token" else None
        answer = probe_cluster(address, gcs, connect_timeout_s, sent)
        if answer == "authentication" and sent is None and token is not None:
            # a cluster that asks for a token gets the user's, as ray.init would with
            # RAY_AUTH_MODE=token; one that does not ask never sees it
            sent = token
            answer = probe_cluster(address, gcs, connect_timeout_s, sent)
        if answer == "authentication":
            message = refused_message(address, sent)
            if mode == "disabled":
                message += f" (RAY_AUTH_MODE={os.environ[AUTH_MODE_VAR]} here)"
            raise RayConnectionError(message, address=address, reason="authentication")
        if sent is not None and mode != "token":
            return {AUTH_MODE_VAR: "token"}
        return {}

    @classmethod
    def _restore_environ(cls, ray: Any) -> None:
        saved, cls._saved_environ = cls._saved_environ, {}
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if saved:
            refresh_ray_config(ray)

    @classmethod
    def release(cls) -> None:
        import ray

        with cls._lock:
            if not cls._started_here:
                return
            cls._users -= 1
            if cls._users <= 0:
                cls._started_here, cls._users = False, 0
                ray.shutdown()
                cls._restore_environ(ray)
                # ray.init installs a SIGTERM handler of its own (which exits) and leaves it
                main_thread = threading.current_thread() is threading.main_thread()
                if cls._sigterm is not None and main_thread:
                    signal.signal(signal.SIGTERM, cls._sigterm)
                cls._sigterm = None


def _ray_children() -> set[int]:
    """This process's child processes that run Ray (its GCS, raylet, workers, reaper)."""
    from vecaccel.testing.leaks import descendants

    try:
        children = descendants(os.getpid())
    except OSError:  # no /proc
        return set()
    found = set()
    for pid in children:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                command = file.read()
        except OSError:
            continue
        if b"ray" in command:
            found.add(pid)
    return found
