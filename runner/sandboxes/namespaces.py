"""The Linux namespaces a host-sandbox trial runs in, and the trial's processes in them.

A trial's namespaces (mount and PID; a user namespace when rootless; a network namespace when the
task asks for no network) are made by `unshare` and held open by one `sleep infinity`, the holder:
init of the trial's PID namespace, so every process of the trial dies with it. This module names
the `unshare`/`nsenter` arguments, waits for a holder to be ready, pins its namespace, lists the
processes in it and kills them; `host.py` drives it for each trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import time
from pathlib import Path

from tapdeck.runner.process_group import GONE_WITHIN_S

# A PID namespace whose init is unshare's forked child; `--kill-child` gives that child SIGKILL
# when unshare dies, and with the init the kernel kills every process of the namespace.
PID_NAMESPACE = ("--pid", "--fork", "--kill-child")
ROOT_UNSHARE = ("--mount", "--propagation", "private", *PID_NAMESPACE)
# A user namespace mapping the invoking user to root, with its own mount and PID namespaces.
ROOTLESS_UNSHARE = ("--user", "--map-root-user", "--mount", "--propagation", "private", *PID_NAMESPACE)
HOLDER_READY_TIMEOUT_S = 30.0  # a bound for a loaded machine; a healthy start takes well under 1 s

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the forked holder: get SIGKILL if the process that started it dies (no stray holders)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def mount_namespace(pid: int) -> str | None:
    """The mount namespace of process `pid`, e.g. `mnt:[4026532177]` (None when it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """Pids whose parent is `pid` (read from /proc, which needs no CONFIG_PROC_CHILDREN)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{entry}/status").read_text()
            match = re.search(r"^PPid:\s*(\d+)", status, re.MULTILINE)
            if match and int(match.group(1)) == pid:
                found.append(int(entry))
    return found


def processes_in_namespace(namespace: str) -> list[int]:
    """Pids of every process whose mount namespace is `namespace` (e.g. `mnt:[4026532177]`)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and mount_namespace(int(entry)) == namespace:
            pids.append(int(entry))
    return pids


async def wait_for_holder(holder: asyncio.subprocess.Process) -> tuple[int, str]:
    """Wait until unshare's child (the trial's init) has left our mount namespace and exec'd
    `sleep`; returns its host pid and its mount namespace."""
    own = mount_namespace(os.getpid())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HOLDER_READY_TIMEOUT_S
    while loop.time() < deadline:
        if holder.returncode is not None:
            err = (await holder.stderr.read()).decode(errors="replace") if holder.stderr else ""
            raise RuntimeError(f"host sandbox namespace holder exited: {err.strip()}")
        for pid in await asyncio.to_thread(children, holder.pid):
            namespace = mount_namespace(pid)
            with contextlib.suppress(OSError):
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm == "sleep" and namespace and namespace != own:
                    return pid, namespace
        await asyncio.sleep(0.01)
    raise RuntimeError("host sandbox namespace holder did not start in time")


def pin_namespace(pid: int, namespace: str) -> int:
    """Open the holder's mount namespace and check it is still `namespace`; returns the fd.

    An open fd pins the namespace: the kernel reuses a freed namespace's id at once, so without
    the pin, stopping one trial could kill the next trial's processes."""
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    if os.readlink(f"/proc/self/fd/{fd}") != namespace:
        os.close(fd)
        raise RuntimeError("host sandbox namespace holder exited while starting")
    return fd


async def kill_namespace(namespace: str, pin: int) -> None:
    """SIGKILL every process in the pinned mount namespace `namespace`, then let the pin go."""
    try:
        # Loop: a process may fork while we kill its siblings, and a killed one is still
        # listed until its signal lands (longer on a loaded machine).
        deadline = time.monotonic() + GONE_WITHIN_S
        while time.monotonic() < deadline:
            pids = processes_in_namespace(namespace)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.02)
    finally:
        os.close(pin)


def nsenter_argv(init_pid: int, *, rootless: bool, no_network: bool) -> list[str]:
    """`nsenter` into the trial whose init is `init_pid`: its mount and PID namespaces (its user
    namespace, root and working directory when rootless; its network namespace when cut off)."""
    # -p: nsenter forks the command into the trial's PID namespace, so it dies with the holder.
    argv = ["nsenter", "-t", str(init_pid), "-m", "-p"]
    if rootless:
        # Keep our uid (mapped to root inside: setgroups is denied there) and take the
        # holder's root and working directory, i.e. the trial's root directory.
        argv += ["-U", "--preserve-credentials", "-r", "-w"]
    if no_network:
        argv.append("-n")
    return [*argv, "--"]


def nsenter_net_argv(init_pid: int, *, rootless: bool) -> list[str]:
    """`nsenter` into the trial's network namespace only: the host's files stay in view, so this
    Python (which may live under a /tmp the trial has its own of) and a relay's socket are found."""
    argv = ["nsenter", "-t", str(init_pid), "-n", "-p"]
    if rootless:
        argv += ["-U", "--preserve-credentials"]  # the net namespace belongs to the trial's user namespace
    return [*argv, "--"]


__all__ = [
    "HOLDER_READY_TIMEOUT_S",
    "PID_NAMESPACE",
    "ROOTLESS_UNSHARE",
    "ROOT_UNSHARE",
    "children",
    "die_with_parent",
    "kill_namespace",
    "mount_namespace",
    "nsenter_argv",
    "nsenter_net_argv",
    "pin_namespace",
    "processes_in_namespace",
    "wait_for_holder",
]
