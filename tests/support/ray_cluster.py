"""Loopback-only Ray for the tests: a network namespace whose only interface is ``lo``, and a
look at every socket the Ray processes listen on.

:func:`loopback_namespace` moves the calling thread (and every process and thread it starts
afterwards: Ray's GCS, raylets, workers and the driver's own threads) into a fresh network
namespace with only ``lo`` up, so no packet can leave the machine, and moves it back on exit.
Where the machine does not allow it (not root, not Linux) the body runs in the machine's own
namespace and Ray is bound to 127.0.0.1 only.
"""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import os
import signal
import socket
import struct
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_TCP_LISTEN = "0A"

#: What every Ray test passes to ``ray.init`` / the cluster's nodes, besides the address.
RAY_NODE_ARGS = {"node_ip_address": "127.0.0.1", "include_dashboard": False}


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


@contextmanager
def loopback_namespace() -> Iterator[bool]:
    """Run the body in a new network namespace with only loopback; yield whether it could.

    Example:
        >>> with loopback_namespace() as isolated:
        ...     isinstance(isolated, bool)
        True
    """
    if not sys.platform.startswith("linux"):
        yield False
        return
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        original = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        if libc.unshare(CLONE_NEWNET) != 0:  # EPERM without CAP_SYS_ADMIN
            yield False
            return
        try:
            _loopback_up()
            yield True
        finally:
            if libc.setns(original, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "could not return to the original namespace")
    finally:
        os.close(original)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    host = hex_address.split(":")[0]
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # /proc/net/tcp6 prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words)


def listening_addresses(pids: Iterable[int]) -> dict[int, list[str]]:
    """``{pid: [address, ...]}``: the TCP addresses each process listens on."""
    found: dict[int, list[str]] = {}
    for pid in pids:
        inodes = _socket_inodes(pid)
        if not inodes:
            continue
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{table}") as file:
                    rows = file.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                fields = row.split()
                if fields[3] == _TCP_LISTEN and fields[9] in inodes:
                    found.setdefault(pid, []).append(str(_address(fields[1])))
    return found


def is_loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (an IPv4-mapped one included).

    Example:
        >>> is_loopback("::ffff:127.0.0.1"), is_loopback("0.0.0.0")
        (True, False)
    """
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@contextmanager
def sigterm_handler_kept() -> Iterator[None]:
    """Put this process's SIGTERM handler back on exit: ``ray.init`` and an in-process head
    node install their own (which exits) and leave them after ``ray.shutdown``, so a later test
    of the same worker process would run Ray's handler on a SIGTERM.

    Example:
        >>> with sigterm_handler_kept():
        ...     _ = signal.signal(signal.SIGTERM, lambda *_: None)
        >>> signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        True
    """
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def loopback_ray() -> Iterator[bool]:
    """Where a Ray test module runs: :func:`loopback_namespace`, with Ray's usage statistics
    off; yields whether the namespace could be made."""
    saved = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        with loopback_namespace() as isolated:
            yield isolated
    finally:
        if saved is None:
            os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
        else:
            os.environ["RAY_USAGE_STATS_ENABLED"] = saved


@contextmanager
def connected_cluster(num_nodes: int, num_cpus: int) -> Iterator[object]:
    """A ``ray.cluster_utils.Cluster`` of ``num_nodes`` nodes with ``num_cpus`` CPUs each, all at
    127.0.0.1, this process connected; shut down, and this process's SIGTERM handler put back,
    on exit. Run it inside :func:`loopback_ray`."""
    import ray
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    with sigterm_handler_kept():
        node = {"num_cpus": num_cpus, **RAY_NODE_ARGS}
        cluster = Cluster(initialize_head=True, head_node_args=node)
        try:
            for _ in range(num_nodes - 1):
                cluster.add_node(**node)
            ray.init(address=cluster.address, logging_level="WARNING")
            cluster.wait_for_nodes()
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 (in this thread's network namespace)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def ray_start(
    env: dict[str, str], join: str | None = None, num_cpus: int = 2, timeout_s: float = 60
) -> Iterator[str]:
    """A node started as users start one, ``ray start --head --node-ip-address 127.0.0.1``
    (or ``ray start --address JOIN`` for a node joining the head at ``join``), with ``env`` (a
    temporary ``HOME``, ``RAY_AUTH_MODE``...); yields the cluster's address.

    Its temp dir is a fresh one (not /tmp/ray, whose ``ray_current_cluster`` other Ray users of
    the machine read) and is removed on exit. The node runs with ``--block`` as one process
    group, stopped on exit by signalling that group: ``ray stop`` would stop every Ray on the
    machine. Run it inside :func:`loopback_ray`.
    """
    import shutil
    import subprocess
    import tempfile
    import time

    from vecaccel.testing.leaks import descendants, wait_until

    temp_dir = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths must fit 107 bytes
    address = join or f"127.0.0.1:{free_port()}"
    command = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--block"]
    if join is None:
        command += ["--head", f"--port={address.rsplit(':', 1)[1]}", "--include-dashboard=false"]
    else:
        command += [f"--address={join}"]
    command += [
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={num_cpus}",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    full_env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        **env,
    }
    log = open(os.path.join(temp_dir, "ray_start.log"), "w+")
    head = subprocess.Popen(
        command, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    started: dict[int, str | None] = {}

    def note_processes() -> None:
        for pid in descendants(head.pid) | {head.pid}:
            started.setdefault(pid, _start_time(pid))

    try:
        deadline = time.monotonic() + timeout_s
        while True:
            log.seek(0)
            text = log.read()
            if "Ray runtime started" in text:
                break
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`{' '.join(command[1:])}` did not start:\n{text}")
            time.sleep(0.2)
        note_processes()
        yield address
    finally:
        note_processes()
        try:
            os.killpg(head.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if not wait_until(lambda: head.poll() is not None, 20):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        for pid, since in started.items():  # a Ray process outside the group, or slow to go
            if _start_time(pid) == since:  # the same process, not a new one with its pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
