"""A host-sandbox trial's view of the filesystem, as the bash its namespace runs to build it.

The per-trial host directories are bound over the paths Harbor uses (`binds`: sandbox path → host
directory), parents first, so a workdir nested under /tmp (say) lands on top, not hidden; host
directories the trial must not see are covered by empty read-only folders. As root the binds go
over the real paths in a private mount namespace; rootless, the holder builds a root directory of
its own (every top-level host entry bound in, then the binds) and chroots into it.
"""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path


def _parents_first(binds: dict[str, Path]) -> list[tuple[str, Path]]:
    return sorted(binds.items(), key=lambda kv: kv[0].count("/"))


def as_root_script(
    trial_root: Path,
    staging: str,
    binds: dict[str, Path],
    private_dirs: list[str],
    hidden_paths: list[str],
    logger: logging.Logger,
    *,
    no_network: bool,
) -> str:
    """Bash, run in the trial's namespaces as root: the binds over the real paths (their mount
    points exist, claimed on the host or under a private parent), `private_dirs` made (mode 700),
    the trial's own /proc, the hidden paths covered, and loopback up when cut off from the
    network."""
    # The per-trial root may live under a path about to be covered (the default is under
    # /tmp), so it is first bound at a staging point and every bind reads from there.
    stage = shlex.quote(staging)
    script = ["set -e", f"mount --bind {shlex.quote(str(trial_root))} {stage}"]
    for target, host_dir in _parents_first(binds):
        source = shlex.quote(f"{staging}/{host_dir.name}")
        # A bind needs an existing mount point (claimed on the host; under a private parent such
        # as /tmp it is made here).
        script.append(f"mkdir -p {shlex.quote(target)} && mount --bind {source} {shlex.quote(target)}")
    script.append(f"umount {stage}")
    script.append(f"mkdir -p -m 700 {' '.join(shlex.quote(d) for d in private_dirs)}")
    # This script runs in the trial's PID namespace: a proc mounted here shows only its pids
    # (where the kernel refuses, the trial keeps the host's, as rootless does).
    script.append("mount -t proc proc /proc 2>/dev/null || true")
    script += hide_script(hidden_paths, binds, "", logger)
    if no_network:
        # sysfs shows the network namespace it was mounted in: remount it for this one.
        script += ["ip link set lo up", "mount -t sysfs sysfs /sys"]
    return "\n".join(script)


def rootless_script(
    rootfs: Path, binds: dict[str, Path], hidden_paths: list[str], logger: logging.Logger, *, no_network: bool
) -> str:
    """Bash for the rootless holder: host top-level entries into `rootfs`, the binds, the hidden
    paths covered, then chroot. RuntimeError for a bound path it would have to make inside a host
    directory (that needs root)."""
    root = str(rootfs)
    whole = {t.strip("/") for t in binds if t.count("/") == 1}
    # The script runs as init of the trial's PID namespace: a proc mounted by it shows only the
    # trial's pids. A kernel that refuses proc in a user namespace (a host proc partly hidden,
    # as in some containers) gets the host's, where pids inside and in /proc differ.
    proc = shlex.quote(f"{root}/proc")
    lines = [
        "set -e",
        f"mkdir {proc}",
        f"mount -t proc proc {proc} 2>/dev/null || mount --rbind /proc {proc}",
    ]
    for entry in sorted(os.listdir("/")):
        if entry in whole or entry == "proc":
            continue
        source, target = shlex.quote(f"/{entry}"), shlex.quote(f"{root}/{entry}")
        if os.path.islink(f"/{entry}"):
            lines.append(f"ln -s {shlex.quote(os.readlink(f'/{entry}'))} {target}")
        elif os.path.isdir(f"/{entry}"):
            lines.append(f"mkdir {target} && mount --rbind {source} {target}")
        elif os.path.isfile(f"/{entry}"):
            lines.append(f"touch {target} && mount --bind {source} {target}")
    for target, host_dir in _parents_first(binds):
        top = target.strip("/").split("/")[0]
        if top not in whole and not os.path.isdir(target):
            raise RuntimeError(
                f"rootless host sandbox cannot make {target}: /{top} is the host's own "
                "directory (making it there would need root); use a top-level workdir"
            )
        point = shlex.quote(f"{root}{target}")
        lines.append(f"mkdir -p {point} && mount --bind {shlex.quote(str(host_dir))} {point}")
    lines += hide_script(hidden_paths, binds, root, logger)
    if no_network:
        lines += ["ip link set lo up", f"mount -t sysfs sysfs {shlex.quote(root)}/sys"]
    lines.append(f"exec chroot {shlex.quote(root)} sleep infinity")
    return "\n".join(lines)


def hide_script(
    hidden_paths: list[str], binds: dict[str, Path], root: str, logger: logging.Logger
) -> list[str]:
    """Bash covering each hidden path that the trial would see (under `root`) with an empty
    read-only tmpfs. A path holding a bound one (say `/`) is left, with a warning: covering it
    would hide the trial's own directories."""
    lines = []
    for path in hidden_paths:
        if any(t == path or t.startswith(path.rstrip("/") + "/") for t in binds):
            logger.warning(
                "host sandbox cannot hide %s: it holds the trial's own %s", path, ", ".join(sorted(binds))
            )
            continue
        point = shlex.quote(f"{root}{path}")
        lines.append(
            f"if [ -d {point} ]; then mount -t tmpfs -o ro,mode=0555,size=4k tapdeck-hidden {point}; fi"
        )
    return lines


__all__ = ["as_root_script", "hide_script", "rootless_script"]
