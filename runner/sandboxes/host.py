"""The host sandbox: a Harbor environment that runs a trial as host processes.

Harbor's commands and task scripts hard-code absolute paths (`/logs/verifier/...`, `/tests`,
`/solution`, `/installed-agent`, the workdir such as `/app`), so rewriting arguments cannot work:
those paths must exist in the processes' own view of the filesystem. Each trial therefore gets a
private mount namespace, held open by one `sleep infinity` process, in which per-trial host
directories are bind-mounted over those paths (and over `/tmp`). Everything else is the real host.

Each trial also gets its own PID namespace, whose init is that `sleep` (the "holder"): every
command runs inside it, so processes that daemonise (terminus-2's tmux server) are still the
trial's. The holder dies with the process that started it (the `unshare` above it gets SIGKILL when
the server dies, and passes it on), and the kernel kills a PID namespace with its init: a `kill -9`
of the server leaves no process of any trial behind, and the next trial started removes the
per-trial folders it left (`trial_dirs.py`). The trial has its own `/proc`, so `ps`,
`pgrep` and `/proc/<pid>` inside show its own processes with the pids it knows them by.

Two modes:
- As root (CAP_SYS_ADMIN), the namespace binds over the real paths; the empty mount points on the
  host (`/app` or the task's workdir, `/logs`, `/tests`, `/solution`, `/installed-agent`) are made
  when missing and removed when the last trial using them ends (`mount_points.py`).
- Rootless (any other user, with unprivileged user namespaces): a user namespace maps the invoking
  user to root, and the trial gets its own root directory: every top-level host directory
  rbind-mounted into it, the per-trial directories bound at their paths, then `chroot`. Nothing is
  made on the host outside the per-trial directory. Every command runs as the invoking user (seen
  as root inside); other users cannot be switched to, and a workdir nested in an existing host
  directory must already exist there.

What this is and is not:
- Each trial also gets a private `/tmp` (with its own `TMUX_TMPDIR`: terminus-2 always names its
  tmux session `terminus-2`) and, for root, a private HOME inside it. A task that asks for no
  network gets a private network namespace with loopback only (host-side harnesses such as
  terminus-2 run in the Harbor process and still reach a loopback proxy). Host directories given
  as `hidden_paths` (the runner gives its data dir: store, admin key, other rollouts' trial
  folders) show as empty read-only folders, and the folder holding every trial's folder, when
  it lies outside /tmp, shows as an empty one of the trial's own.
- It ignores the task's Dockerfile: the host is the image, so every tool a task's Dockerfile would
  install must already be on the host; installed agents would install into the host.
- It is NOT a security boundary: processes run as real host users, see the real host filesystem
  (outside the bound paths; the host's processes too where the kernel refused the trial its own
  `/proc`) and, unless the task asks for no network, the host's network.

Harbor loads it by import path:
`EnvironmentConfig(import_path="tapdeck.runner.sandboxes.host:HostSandbox")`. This module is the
environment class; its parts live beside it: `namespaces.py` (unshare/nsenter, the holder, killing
a trial's processes), `filesystem_view.py` (the bash that binds the per-trial directories),
`exec_command.py` (one command run), `file_copies.py` (files in and out), `environment_definition.py`
(what is read of the task's environment/), `trial_dirs.py`, `mount_points.py`, `loopback_relay.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import pwd
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tapdeck.runner.harbor_api import (
    BaseEnvironment,
    EnvironmentCapabilities,
    ExecResult,
    NetworkMode,
)
from tapdeck.runner.sandboxes.environment_definition import compose_services, dockerfile_workdir
from tapdeck.runner.sandboxes.exec_command import run_command
from tapdeck.runner.sandboxes.file_copies import copy_dir, copy_file, host_path
from tapdeck.runner.sandboxes.filesystem_view import as_root_script, rootless_script
from tapdeck.runner.sandboxes.loopback_relay import LoopbackRelay
from tapdeck.runner.sandboxes.mount_points import STATE_DIR, MountPoints
from tapdeck.runner.sandboxes.namespaces import (
    HOLDER_READY_TIMEOUT_S,
    ROOT_UNSHARE,
    ROOTLESS_UNSHARE,
    die_with_parent,
    kill_namespace,
    nsenter_argv,
    nsenter_net_argv,
    pin_namespace,
    wait_for_holder,
)
from tapdeck.runner.sandboxes.output_tail import OUTPUT_LIMIT_BYTES
from tapdeck.runner.sandboxes.trial_dirs import TrialDir, remove_abandoned

TYPE_NAME = "tapdeck-host"

# Paths Harbor and its agents use inside an environment; each gets its own per-trial directory.
FIXED_TARGETS = ("/logs", "/tests", "/solution", "/installed-agent", "/tmp")
DEFAULT_WORKDIR = "/app"
# root's HOME inside the sandbox (in the private /tmp, so it vanishes with the trial).
PRIVATE_HOME = "/tmp/tapdeck-home"
# A container-like PATH: the host user's own PATH (pyenv shims, cargo, ...) does not leak in.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REQUIRED_TOOLS = ("unshare", "nsenter", "bash", "mount")
_CHECK_TIMEOUT_S = 15.0

LIMITATIONS = (
    "runs the trial as host processes in a private mount namespace; needs root (CAP_SYS_ADMIN) "
    "or unprivileged user namespaces (rootless: every command runs as the invoking user, seen as "
    "root inside); ignores the task's Dockerfile (tools it would install must already be on "
    "the host); NOT a security boundary (real host users, filesystem, processes and network)"
)


def check(rootless: bool | None = None) -> tuple[bool, str]:
    """Whether the host sandbox can run here, without raising: `(ok, why)`.

    `rootless` None means: rootless unless running as root. Creates (and immediately drops) one
    namespace to prove the kernel allows it: a root user inside an unprivileged container may
    still lack CAP_SYS_ADMIN, and many systems disable unprivileged user namespaces. Bounded in
    time.
    """
    if not sys.platform.startswith("linux"):
        return False, f"host sandbox needs Linux mount namespaces (this is {sys.platform}); {LIMITATIONS}"
    rootless = os.geteuid() != 0 if rootless is None else rootless
    tools = (*REQUIRED_TOOLS, "chroot") if rootless else REQUIRED_TOOLS
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return False, f"host sandbox needs {', '.join(missing)} (util-linux) on PATH; {LIMITATIONS}"
    argv = ["unshare", *(ROOTLESS_UNSHARE if rootless else ROOT_UNSHARE)]
    what = "a user namespace" if rootless else "mount and PID namespaces"
    try:
        probe = subprocess.run(
            [*argv, "--", "true"], capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"host sandbox could not create {what} ({exc}); {LIMITATIONS}"
    if probe.returncode != 0:
        need = (
            "unprivileged user namespaces, which this system refuses (see "
            "/proc/sys/user/max_user_namespaces and kernel.apparmor_restrict_unprivileged_userns)"
            "; or run as root"
            if rootless
            else "CAP_SYS_ADMIN"
        )
        return False, (
            f"host sandbox could not create {what} (needs {need}): "
            f"{probe.stderr.strip() or probe.returncode}; {LIMITATIONS}"
        )
    mode = "rootless, as this user (seen as root inside)" if rootless else "as root"
    return True, f"available ({mode}): {LIMITATIONS}"


class HostSandbox(BaseEnvironment):
    """Harbor environment running a trial as host processes in a private mount namespace.

    Constructor kwargs (via `EnvironmentConfig(kwargs=...)`): `base_dir` (where per-trial
    directories are made; default the system temp dir), `path` (PATH inside the sandbox),
    `network` (`"auto"`: cut the network when the task asks for no network, `"host"`, `"none"`),
    `private_home` (root's HOME is a fresh per-trial directory, so the host's dotfiles — e.g. a
    `.bashrc` that runs pyenv — and anything an agent installs under HOME stay out of the trial;
    other users keep their real home), `rootless` (None: rootless unless running as root),
    `state_dir` (the lock shared by every trial that uses the same host mount points, and the
    staging point; not under /tmp, which the trial covers), `loopback_ports` (host loopback
    ports still reachable at the same address from a trial cut off from the network, such as the
    capture proxy's: `loopback_relay`), `hidden_paths` (host directories the trial must not see,
    each covered by an empty read-only directory in its view: the runner hides the tapdeck data
    dir, whose store, admin key and other rollouts' trial folders are no business of a trial),
    `output_limit_bytes` (how much of each stream of a command `exec` returns: its last bytes,
    `output_tail`; the output callback still gets all of it).
    """

    def __init__(
        self,
        *args,
        base_dir: str | Path | None = None,
        path: str = DEFAULT_PATH,
        network: str = "auto",
        private_home: bool = True,
        rootless: bool | None = None,
        state_dir: str | Path = STATE_DIR,
        loopback_ports: list[int] | None = None,
        hidden_paths: list[str] | None = None,
        output_limit_bytes: int = OUTPUT_LIMIT_BYTES,
        **kwargs,
    ):
        if network not in ("auto", "host", "none"):
            raise ValueError(f"network must be 'auto', 'host' or 'none', not {network!r}")
        self._base_dir = Path(base_dir) if base_dir else None
        self._path = path
        self._network_choice = network
        self._private_home = private_home
        self._rootless = os.geteuid() != 0 if rootless is None else rootless
        self._state_dir = Path(state_dir)
        if self._state_dir.is_relative_to("/tmp"):
            raise ValueError(f"state_dir {state_dir} is under /tmp, which each trial covers")
        # `unshare`, our child; its own child `_init_pid` is the holder (init of the trial's PID
        # namespace, pid 1 inside, seen from here by its host pid).
        self._holder: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        self._namespace: str | None = None
        # An open fd on the namespace pins it: the kernel reuses a freed namespace's id at once,
        # so without the pin, stopping this trial could kill the next trial's processes.
        self._namespace_fd: int | None = None
        self._trial_dir: TrialDir | None = None
        self._root: Path | None = None
        self._binds: dict[str, Path] = {}
        self._mount_points: MountPoints | None = None
        self._tmux_tmpdir = f"/tmp/tapdeck-tmux-{secrets.token_hex(6)}"
        self._loopback_ports = [int(p) for p in loopback_ports or ()]
        self._hidden_paths = [os.path.realpath(p) for p in hidden_paths or ()]
        if output_limit_bytes < 1:
            raise ValueError(f"output_limit_bytes must be at least 1, not {output_limit_bytes}")
        self._output_limit = output_limit_bytes
        self._relays: list[LoopbackRelay] = []
        self._inner_relays: list[asyncio.subprocess.Process] = []
        super().__init__(*args, **kwargs)
        self.workdir = (
            self.task_env_config.workdir or dockerfile_workdir(self.environment_dir) or DEFAULT_WORKDIR
        )

    @staticmethod
    def type() -> str:
        """The environment type name (not one of Harbor's `EnvironmentType` members)."""
        return TYPE_NAME

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """Honest flags: only a no-network cut-off (a private network namespace, loopback only)."""
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """Refuse a task whose docker-compose.yaml starts services besides `main` (a database, a
        second machine): the trial runs as host processes and nothing would start them. The
        Dockerfile, and a compose file with `main` alone, are ignored (the host is the image)."""
        others = [name for name in compose_services(self.environment_dir) if name != "main"]
        if others:
            raise ValueError(
                f"host sandbox cannot start compose service(s) {', '.join(others)}: use a "
                f"container sandbox (--sandbox docker) for this task; the host sandbox runs one "
                f"environment as host processes ({self.environment_dir}/docker-compose.yaml)"
            )

    @classmethod
    def preflight(cls) -> None:
        """Harbor's 0.25 preflight: raise SystemExit with the reason when the host cannot run it."""
        ok, why = check()
        if not ok:
            raise SystemExit(why)

    @property
    def no_network(self) -> bool:
        """Whether this trial's processes get a private network namespace with loopback only."""
        if self._network_choice == "none":
            return True
        if self._network_choice == "host":
            return False
        return self._network_disabled or self.task_env_config.network_mode == NetworkMode.NO_NETWORK

    @property
    def rootless(self) -> bool:
        """Whether the trial runs in a user namespace, as the invoking user seen as root."""
        return self._rootless

    @property
    def tmux_tmpdir(self) -> str:
        """The per-trial `TMUX_TMPDIR` (terminus-2 always names its session `terminus-2`)."""
        return self._tmux_tmpdir

    @property
    def host_root(self) -> Path | None:
        """The host directory holding this trial's per-trial directories (None when stopped)."""
        return self._root

    @property
    def namespace(self) -> str | None:
        """The holder's mount namespace id, e.g. `mnt:[4026532177]` (None when stopped)."""
        return self._namespace

    # ---------------------------------------------------------------- lifecycle

    async def start(self, force_build: bool) -> None:
        """Create per-trial directories, the namespace holder, and the bind mounts."""
        ok, why = check(self._rootless)
        if not ok:
            raise RuntimeError(why)
        try:
            await self._start()
        except BaseException:
            # Harbor may not call stop() after a failed start: leave nothing behind.
            await self.stop(delete=True)
            raise

    async def _start(self) -> None:
        if (self.environment_dir / "Dockerfile").is_file():
            self.logger.debug("host sandbox ignores %s/Dockerfile", self.environment_dir)
        abandoned = await asyncio.to_thread(remove_abandoned, self._base_dir)
        if abandoned:
            self.logger.info(
                "host sandbox removed %d trial folder(s) a dead process left: %s",
                len(abandoned),
                ", ".join(map(str, abandoned)),
            )
        targets = self._make_trial_dirs()
        if self._rootless:
            await self._start_rootless()
        else:
            await self._start_as_root(targets)
        if self.no_network:
            await self._start_relays()
        await self._upload_environment_dir_after_start()

    async def _start_relays(self) -> None:
        """Carry each of `loopback_ports` into the trial's loopback-only network namespace."""
        for port in self._loopback_ports:
            name = f"tapdeck-relay-{port}.sock"
            relay = LoopbackRelay(port, self._binds["/tmp"] / name)
            await relay.start()
            self._relays.append(relay)
            inner = await asyncio.create_subprocess_exec(
                *self._nsenter_net(),
                *relay.inner_command(str(self._binds["/tmp"] / name)),
                env=self._base_env("/root"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            self._inner_relays.append(inner)
            # Both are pipes (PIPE above), so asyncio gave the process a reader for each.
            assert inner.stdout is not None and inner.stderr is not None
            try:
                line = await asyncio.wait_for(inner.stdout.readline(), HOLDER_READY_TIMEOUT_S)
            except TimeoutError:
                line = b""
            if line.strip() != b"ready":
                err = (await inner.stderr.read()).decode(errors="replace") if inner.returncode else ""
                raise RuntimeError(
                    f"host sandbox could not relay loopback port {port} into the "
                    f"trial's network namespace: {err.strip() or 'no answer'}"
                )

    def _make_trial_dirs(self) -> list[str]:
        """The per-trial host directories, one per bound path; returns the bound paths."""
        self._trial_dir = TrialDir.make(self._base_dir)
        self._root = self._trial_dir.path
        targets = [self.workdir, *FIXED_TARGETS]
        parent = self._trial_parent_in_view(targets)
        if parent is not None:
            targets.append(parent)
        for target in targets:
            host_dir = self._root / target.strip("/").replace("/", "__")
            host_dir.mkdir(parents=True, exist_ok=True)
            if parent is not None and target == parent:
                host_dir.chmod(os.stat(parent).st_mode & 0o7777)
            else:
                host_dir.chmod(0o1777 if target == "/tmp" else 0o755)
            self._binds[target] = host_dir
        for sub in ("agent", "verifier", "artifacts"):
            (self._binds["/logs"] / sub).mkdir(mode=0o777, exist_ok=True)
            (self._binds["/logs"] / sub).chmod(0o777)
        return targets

    def _trial_parent_in_view(self, targets: list[str]) -> str | None:
        """The folder holding every trial's folder when the trial would see it (a base dir
        outside /tmp): it then gets an empty per-trial directory, as /tmp does, so no trial reaches
        another's workspace. None when a bound path already covers it, or it holds one."""
        assert self._root is not None
        parent = str(self._root.parent.resolve())
        for target in targets:
            if (
                parent == target
                or (parent + "/").startswith(target.rstrip("/") + "/")
                or target.startswith(parent.rstrip("/") + "/")
            ):
                return None
        return parent

    async def _start_as_root(self, targets: list[str]) -> None:
        # Mount points under another bound path (a workdir in /tmp) are made privately, in the
        # namespace; the rest must exist on the host.
        on_host = [t for t in targets if not any(t.startswith(o.rstrip("/") + "/") for o in targets)]
        self._mount_points = MountPoints(self._state_dir)
        # An empty directory on the host where the namespace briefly mounts the per-trial root.
        staging = str(self._mount_points.state_dir / "stage")
        await asyncio.to_thread(self._mount_points.claim, [staging, *on_host])

        await self._spawn_holder(["unshare", *ROOT_UNSHARE], ["sleep", "infinity"])

        assert self._root is not None
        script = as_root_script(
            self._root,
            staging,
            self._binds,
            [self._tmux_tmpdir, PRIVATE_HOME],
            self._hidden_paths,
            self.logger,
            no_network=self.no_network,
        )
        result = await self._run_in_namespace(["bash", "-c", script], timeout_sec=30)
        if result.return_code != 0:
            raise RuntimeError(f"host sandbox could not set up its mounts: {result.stderr or result.stdout}")

    async def _start_rootless(self) -> None:
        """The holder builds the trial's root directory in its own namespaces, then chroots."""
        assert self._root is not None
        tmp = self._binds["/tmp"]
        for private in (self._tmux_tmpdir, PRIVATE_HOME):
            (tmp / posixpath.relpath(private, "/tmp")).mkdir(mode=0o700, parents=True, exist_ok=True)
        rootfs = self._root / "rootfs"
        rootfs.mkdir()
        await self._spawn_holder(
            ["unshare", *ROOTLESS_UNSHARE], ["bash", "-c", self._rootless_script(rootfs)]
        )

    async def _spawn_holder(self, unshare: list[str], command: list[str]) -> None:
        """Start the holder (`command` ends as `sleep infinity` in the new namespaces), wait for
        it, and pin its namespace."""
        if self.no_network:
            unshare = [*unshare, "--net"]
        self._holder = await asyncio.create_subprocess_exec(
            *unshare,
            "--",
            *command,
            # The holder is the trial's first process, its environment readable there (/proc/1/environ
            # in the rootless namespace): never the server's, which holds provider and admin keys.
            env=self._base_env("/root"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self._init_pid, self._namespace = await wait_for_holder(self._holder)
        self._namespace_fd = pin_namespace(self._init_pid, self._namespace)

    def _rootless_script(self, rootfs: Path) -> str:
        """Bash for the rootless holder: host top-level entries into `rootfs`, the binds, then chroot."""
        return rootless_script(
            rootfs, self._binds, self._hidden_paths, self.logger, no_network=self.no_network
        )

    async def stop(self, delete: bool) -> None:
        """Kill every process in the trial's mount namespace, then remove the per-trial dirs.

        With `delete=False` the per-trial directories are kept (their path is logged).
        """
        await self._kill_namespace()
        for relay in self._relays:
            await relay.stop()
        for inner in self._inner_relays:
            if inner.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    inner.kill()
            await inner.wait()
        self._relays, self._inner_relays = [], []
        if self._mount_points is not None:
            removed = await asyncio.to_thread(self._mount_points.release)
            self._mount_points = None
            if removed:
                self.logger.debug("host sandbox removed the mount points it made: %s", removed)
        if self._trial_dir is not None:
            if delete:
                await asyncio.to_thread(self._trial_dir.remove)
            else:
                self._trial_dir.keep()
                self.logger.info("host sandbox kept its directories at %s", self._root)
            self._trial_dir, self._root = None, None
        self._binds = {}

    async def _kill_namespace(self) -> None:
        namespace, holder, pin = self._namespace, self._holder, self._namespace_fd
        self._namespace, self._holder, self._namespace_fd, self._init_pid = None, None, None, None
        # Only a pinned namespace's id is known to still be ours; unpinned, kill just the holder.
        if pin is not None:
            assert namespace is not None, "a namespace is pinned only once its id is known"
            await kill_namespace(namespace, pin)
        if holder is not None:
            if holder.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    holder.kill()
            await holder.wait()

    # ---------------------------------------------------------------- exec

    def _nsenter(self) -> list[str]:
        if self._init_pid is None:
            raise RuntimeError("host sandbox is not started")
        return nsenter_argv(self._init_pid, rootless=self._rootless, no_network=self.no_network)

    def _nsenter_net(self) -> list[str]:
        if self._init_pid is None:
            raise RuntimeError("host sandbox is not started")
        return nsenter_net_argv(self._init_pid, rootless=self._rootless)

    def _base_env(self, home: str) -> dict[str, str]:
        return {
            "PATH": self._path,
            "HOME": home,
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "TMUX_TMPDIR": self._tmux_tmpdir,
        }

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` with bash inside the trial's namespace, as `user` (default: root).

        On timeout the whole process group is killed and RuntimeError raised (as Harbor's docker
        environment does); the environment is clean apart from the merged Harbor env. Of each
        stream, at most the last `output_limit_bytes` are returned.
        """
        user = self._resolve_user(user)
        name, home = self._host_user(user)
        if name == "root" and self._private_home:
            home = PRIVATE_HOME
        argv = self._nsenter()
        if name != "root":
            if self._rootless:
                raise RuntimeError(
                    f"the rootless host sandbox runs every command as the invoking user (seen as "
                    f"root inside); it cannot run one as {name!r}: run tapdeck as root for that"
                )
            argv += ["runuser", "-u", name, "--"]
        workdir = cwd or self.workdir
        argv += ["bash", "-c", f"cd {shlex.quote(workdir)} && {command}"]
        process_env = {**self._base_env(home), **(self._merge_env(env) or {})}
        return await run_command(
            argv,
            process_env,
            timeout_sec,
            self._output_callback(),
            output_limit=self._output_limit,
            logger=self.logger,
        )

    async def _run_in_namespace(self, argv: list[str], timeout_sec: int) -> ExecResult:
        return await run_command(
            self._nsenter() + argv,
            self._base_env("/root"),
            timeout_sec,
            None,
            output_limit=self._output_limit,
            logger=self.logger,
        )

    @staticmethod
    def _host_user(user: str | int | None) -> tuple[str, str]:
        if user is None:
            return "root", "/root"
        try:
            entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(str(user))
        except KeyError:
            raise RuntimeError(
                f"user {user!r} does not exist on this host: the host sandbox runs commands as "
                "real host users (the task's Dockerfile is ignored)"
            ) from None
        return entry.pw_name, entry.pw_dir

    # ---------------------------------------------------------------- files

    def host_path(self, sandbox_path: str) -> Path:
        """Where a sandbox path lives on the host: its per-trial directory, else via the holder
        (`/proc/<holder>/root`, the namespace's own view: for such paths the real host)."""
        if self._init_pid is None:
            raise RuntimeError("host sandbox is not started")
        return host_path(sandbox_path, workdir=self.workdir, binds=self._binds, holder_pid=self._init_pid)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file to `target_path` in the sandbox (parents created)."""
        await asyncio.to_thread(copy_file, source_path, self.host_path(target_path))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host directory's contents into `target_dir` in the sandbox."""
        await asyncio.to_thread(copy_dir, source_dir, self.host_path(target_dir))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a sandbox file to a host path (parents created)."""
        await asyncio.to_thread(copy_file, self.host_path(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a sandbox directory's contents into a host directory (overwriting)."""
        await asyncio.to_thread(copy_dir, self.host_path(source_dir), target_dir)
