"""The host sandbox on the real Harbor package: trials, isolation, cleanup, exec semantics."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
from harbor import Trial
from harbor.agents.base import BaseAgent
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.models.trial.paths import TrialPaths

from tapdeck.runner.catalog import sandbox_environment_config
from tapdeck.runner.datasets import sample_dataset
from tapdeck.runner.sandboxes import host
from tapdeck.runner.sandboxes.host import HostSandbox
from tapdeck.runner.sandboxes.namespaces import ROOTLESS_UNSHARE, children, processes_in_namespace

SAMPLE = sample_dataset()
TASK_NAMES = [t.name for t in SAMPLE.tasks]
USERNS_OK, USERNS_WHY = host.check(rootless=True)
needs_userns = pytest.mark.skipif(not USERNS_OK, reason=f"no user namespaces here: {USERNS_WHY}")
MODES = [pytest.param(False, id="root"), pytest.param(True, id="rootless", marks=needs_userns)]


def _reward(result) -> float:
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None
    return float(result.verifier_result.rewards["reward"])


async def _trial(task_path: Path, agent: AgentConfig, tmp_path: Path, name: str, **env_kwargs):
    config = TrialConfig(
        task=TaskConfig(path=task_path),
        trials_dir=tmp_path / "trials",
        trial_name=name,
        agent=agent,
        environment=sandbox_environment_config("host", base_dir=str(tmp_path / "hostdirs"), **env_kwargs),
    )
    trial = await Trial.create(config)
    return await trial.run()


@pytest.fixture
def hostdirs(tmp_path: Path) -> Path:
    path = tmp_path / "hostdirs"
    path.mkdir()
    return path


@pytest.mark.slow
@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("rootless", MODES)
async def test_oracle_solves_every_sample_task(
    task: str, rootless: bool, tmp_path: Path, hostdirs: Path
) -> None:
    result = await _trial(
        SAMPLE.task(task).path, AgentConfig(name="oracle"), tmp_path, f"{task}__oracle", rootless=rootless
    )
    assert _reward(result) == 1.0
    assert list(hostdirs.iterdir()) == [], "per-trial directories left on the host"


@pytest.mark.slow
@pytest.mark.parametrize("task", TASK_NAMES)
async def test_nop_scores_zero_on_every_sample_task(task: str, tmp_path: Path, hostdirs: Path) -> None:
    result = await _trial(SAMPLE.task(task).path, AgentConfig(name="nop"), tmp_path, f"{task}__nop")
    assert _reward(result) == 0.0
    assert list(hostdirs.iterdir()) == []


class ProbeAgent(BaseAgent):
    """Writes its own file to /app, lists /app, starts tmux session `terminus-2` (as terminus-2
    does) and records what it saw, plus the sandbox's namespace and host dir, in its logs dir."""

    @staticmethod
    def name() -> str:
        return "tapdeck-probe"

    def version(self) -> str:
        return "1"

    async def setup(self, environment) -> None:
        return None

    async def run(self, instruction, environment, context) -> None:
        me = self.logs_dir.parent.name
        await environment.exec(f"echo {me} > /app/{me}.txt")
        await asyncio.sleep(0.2)  # let the other trials write theirs
        listing = await environment.exec("ls /app")
        tmux = await environment.exec(
            "tmux new-session -d -s terminus-2 -x 80 -y 24 && tmux display -p '#{socket_path}'"
        )
        assert tmux.return_code == 0, tmux.stderr
        (self.logs_dir / "probe.txt").write_text(
            "\n".join(
                [
                    (listing.stdout or "").strip().replace("\n", ","),
                    (tmux.stdout or "").strip(),
                    environment.namespace,
                    str(environment.host_root),
                ]
            )
        )


_agents = types.ModuleType("tapdeck_test_host_agents")
_agents.ProbeAgent = ProbeAgent
sys.modules[_agents.__name__] = _agents


@pytest.mark.slow
async def test_three_concurrent_trials_are_isolated_and_leave_nothing(tmp_path: Path, hostdirs: Path) -> None:
    task = SAMPLE.task("hello-file").path
    agent = AgentConfig(import_path="tapdeck_test_host_agents:ProbeAgent")
    names = [f"iso{i}" for i in range(3)]
    results = await asyncio.gather(*(_trial(task, agent, tmp_path, n) for n in names))
    seen = {}
    for name, result in zip(names, results, strict=True):
        assert result.exception_info is None, result.exception_info
        listing, socket, namespace, root = (
            (tmp_path / "trials" / name / "agent" / "probe.txt").read_text().splitlines()
        )
        assert listing == f"{name}.txt", "a trial saw another trial's /app"
        seen[name] = (socket, namespace)
        assert processes_in_namespace(namespace) == [], "processes left in the trial's namespace"
        assert not Path(root).exists()
    sockets = {s for s, _ in seen.values()}
    namespaces = {ns for _, ns in seen.values()}
    assert len(sockets) == 3 and len(namespaces) == 3
    assert not any(Path("/app").glob("iso*.txt")), "a trial wrote through to the host's /app"
    assert list(hostdirs.iterdir()) == []


def _state_dir(tmp_path: Path) -> Path:
    """A mount-point state dir of the test's own: a tapdeck run elsewhere on the machine may hold the
    shared one, and the host mount points this test's trials make (/work/proj) must go when they end."""
    return Path(f"/run/tapdeck-test-{os.getpid()}-{tmp_path.name}")


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path):
    yield
    shutil.rmtree(_state_dir(tmp_path), ignore_errors=True)


def _sandbox(tmp_path: Path, **kwargs) -> HostSandbox:
    kwargs.setdefault("state_dir", _state_dir(tmp_path))
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "Dockerfile").write_text("FROM debian:12\nWORKDIR /work/proj\n")
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()  # idempotent: two sandboxes may share one task and trial
    task_env = TaskEnvironmentConfig(**kwargs.pop("task_env", {}))
    kwargs.setdefault("base_dir", str(tmp_path / "hostdirs"))
    return HostSandbox(
        environment_dir=env_dir,
        environment_name="t",
        session_id="t__env",
        trial_paths=trial_paths,
        task_env_config=task_env,
        logger=logging.getLogger("test"),
        **kwargs,
    )


@pytest.fixture
async def sandbox(tmp_path: Path):
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path)
    await env.start(force_build=False)
    yield env
    await env.stop(delete=True)


async def test_workdir_comes_from_the_dockerfile_and_exec_starts_there(sandbox: HostSandbox) -> None:
    assert sandbox.workdir == "/work/proj"
    result = await sandbox.exec("pwd")
    assert result.stdout.strip() == "/work/proj"


async def test_exec_env_is_clean_and_has_a_private_tmux_tmpdir(sandbox: HostSandbox, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-provider-key")
    result = await sandbox.exec("env", env={"EXTRA": "1"})
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert "OPENAI_API_KEY" not in env
    assert env["EXTRA"] == "1"
    assert env["TMUX_TMPDIR"] == sandbox.tmux_tmpdir
    assert env["PATH"] == host.DEFAULT_PATH


@pytest.mark.parametrize("rootless", MODES)
async def test_server_secrets_never_reach_the_trial_environment(
    rootless: bool, tmp_path: Path, monkeypatch
) -> None:
    # The namespace holder is the trial's first process (pid 1): its environment is readable inside.
    for name in ("ANTHROPIC_API_KEY", "TAPDECK_ADMIN_KEY", "TAPDECK_ENGINE_API_KEY"):
        monkeypatch.setenv(name, f"leak-{name}")
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path, rootless=rootless, task_env={"workdir": "/app"})
    await env.start(force_build=False)
    try:
        printed = await env.exec("env; echo ---; tr '\\0' '\\n' < /proc/1/environ")
    finally:
        await env.stop(delete=True)
    assert printed.return_code == 0, printed
    own, _, holders = printed.stdout.partition("---")
    assert "PATH=" in own and "PATH=" in holders  # both were read
    assert "leak-" not in printed.stdout


@pytest.mark.parametrize("rootless", MODES)
async def test_a_trial_sees_only_its_own_processes_with_its_holder_as_pid_1(
    rootless: bool, tmp_path: Path
) -> None:
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path, rootless=rootless, task_env={"workdir": "/app"})
    await env.start(force_build=False)
    try:
        seen = await env.exec(
            "tmux new-session -d -s terminus-2 'sleep 60'; cat /proc/1/comm; echo ---; ps -e -o comm="
        )
    finally:
        await env.stop(delete=True)
    init, _, listed = seen.stdout.partition("---")
    assert init.strip() == "sleep"
    # bash may have exec'd ps: nothing of the host, only the trial's own.
    assert (
        {"sleep", "tmux: server", "ps"}
        <= set(listed.split("\n"))
        <= {"sleep", "tmux: server", "ps", "bash", ""}
    ), listed


@pytest.mark.slow
@pytest.mark.parametrize("rootless", MODES)
async def test_a_trial_printing_its_environment_sees_no_server_key(
    rootless: bool, tmp_path: Path, hostdirs: Path, monkeypatch
) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TAPDECK_ADMIN_KEY", "TAPDECK_ENGINE_API_KEY"):
        monkeypatch.setenv(name, f"leak-{name}")
    task = tmp_path / "print-env"
    shutil.copytree(SAMPLE.task("hello-file").path, task)
    # The oracle's solution prints its own environment and that of the trial's first process.
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\n{ env; echo ---; tr '\\0' '\\n' < /proc/1/environ; } > /logs/agent/env.txt\n"
    )
    result = await _trial(task, AgentConfig(name="oracle"), tmp_path, "env__oracle", rootless=rootless)
    assert result.exception_info is None, result.exception_info
    printed = (tmp_path / "trials" / "env__oracle" / "agent" / "env.txt").read_text()
    own, _, first = printed.partition("---")
    assert "PATH=" in own and "PATH=" in first  # both were read
    assert "leak-" not in printed


async def test_exec_runs_as_the_requested_host_user(sandbox: HostSandbox) -> None:
    assert (await sandbox.exec("id -un")).stdout.strip() == "root"
    assert (await sandbox.exec("id -un", user="nobody", cwd="/tmp")).stdout.strip() == "nobody"
    with pytest.raises(RuntimeError, match="does not exist on this host"):
        await sandbox.exec("true", user="no-such-user-tapdeck")


async def test_exec_timeout_kills_the_process_group(sandbox: HostSandbox) -> None:
    with pytest.raises(RuntimeError, match="timed out"):
        await sandbox.exec("sleep 300 & sleep 301; wait", timeout_sec=1)
    survivors = [
        pid
        for pid in processes_in_namespace(sandbox.namespace)
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\x0030")
    ]
    assert survivors == []


async def test_exec_streams_output_to_the_output_callback(sandbox: HostSandbox) -> None:
    chunks: list[tuple[str, str]] = []

    async def collect(text: str, stream: str) -> None:
        chunks.append((stream, text))

    with sandbox.scoped_output_callback(collect):
        result = await sandbox.exec("echo out; echo err >&2")
    assert ("stdout", "out\n") in chunks and ("stderr", "err\n") in chunks
    assert result.stdout == "out\n" and result.stderr == "err\n"


async def test_files_round_trip_through_bound_and_unbound_paths(sandbox: HostSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("A")
    await sandbox.upload_dir(src, "/tests")
    await sandbox.upload_file(src / "sub" / "a.txt", "/tmp/x/b.txt")
    check = await sandbox.exec("cat /tests/sub/a.txt /tmp/x/b.txt")
    assert check.stdout == "AA"
    assert not Path("/tmp/x/b.txt").exists(), "/tmp inside the sandbox is private"
    await sandbox.exec("mkdir -p /logs/agent/d && echo hi > /logs/agent/d/f")
    await sandbox.download_dir("/logs/agent", tmp_path / "out")
    await sandbox.download_file("/tmp/x/b.txt", tmp_path / "out2" / "b.txt")
    assert (tmp_path / "out" / "d" / "f").read_text() == "hi\n"
    assert (tmp_path / "out2" / "b.txt").read_text() == "A"


async def test_stop_kills_every_process_in_the_namespace_and_removes_dirs(tmp_path: Path) -> None:
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path)
    await env.start(force_build=False)
    await env.exec("tmux new-session -d -s terminus-2 'sleep 600'; (setsid sleep 601 &)")
    namespace, root = env.namespace, env.host_root
    assert len(processes_in_namespace(namespace)) >= 3  # holder, tmux server, escaped sleep
    await env.stop(delete=True)
    assert processes_in_namespace(namespace) == []
    assert not root.exists()
    assert list((tmp_path / "hostdirs").iterdir()) == []


async def test_stopping_a_trial_never_kills_a_later_trial_given_its_freed_namespace_id(
    tmp_path: Path,
) -> None:
    # The kernel hands a freed namespace id to the next namespace at once; this was seen in CI as
    # a concurrent batch's next trial failing with "namespace holder exited".
    (tmp_path / "hostdirs").mkdir()
    first, second = _sandbox(tmp_path), _sandbox(tmp_path)
    await first.start(force_build=False)
    namespace = first.namespace
    for pid in processes_in_namespace(namespace):
        os.kill(pid, signal.SIGKILL)
    await second.start(force_build=False)
    try:
        assert second.namespace != namespace
        await first.stop(delete=True)
        assert (await second.exec("echo alive")).stdout.strip() == "alive"
    finally:
        await second.stop(delete=True)


async def test_a_workdir_missing_on_the_host_is_made_and_removed_after_the_last_trial(
    tmp_path: Path,
) -> None:
    (tmp_path / "hostdirs").mkdir()
    top = Path(f"/tapdeck-test-{os.getpid()}-{tmp_path.name[-12:]}")
    workdir = top / "proj"
    # A state dir of its own: a tapdeck run elsewhere on the machine holds the shared one.
    state = Path(f"/run/tapdeck-test-{os.getpid()}-{tmp_path.name[-12:]}")
    first = _sandbox(tmp_path, task_env={"workdir": str(workdir)}, state_dir=state)
    second = _sandbox(tmp_path, task_env={"workdir": str(workdir)}, state_dir=state)
    await first.start(force_build=False)
    await second.start(force_build=False)
    try:
        assert (await second.exec("pwd")).stdout.strip() == str(workdir)
        assert workdir.is_dir() and list(workdir.iterdir()) == []  # empty on the host
        await first.stop(delete=True)
        assert workdir.is_dir()  # the second trial still binds over it
    finally:
        await second.stop(delete=True)
        shutil.rmtree(state, ignore_errors=True)
    assert not top.exists()


@needs_userns
async def test_rootless_trial_runs_in_its_own_root_and_makes_nothing_on_the_host(tmp_path: Path) -> None:
    (tmp_path / "hostdirs").mkdir()
    before = sorted(os.listdir("/"))
    env = _sandbox(tmp_path, rootless=True, task_env={"workdir": "/app"})
    await env.start(force_build=False)
    try:
        assert env.rootless
        result = await env.exec(
            "id -u; pwd; echo made > here; ls /logs; echo $HOME; test -x /usr/bin/python3 && echo host-tools"
        )
        assert result.stdout.split() == [
            "0",
            "/app",
            "agent",
            "artifacts",
            "verifier",
            "/tmp/tapdeck-home",
            "host-tools",
        ], result
        assert (env.host_root / "app" / "here").read_text() == "made\n"
        assert sorted(os.listdir("/")) == before  # no /app, /logs, ... made on the host
        with pytest.raises(RuntimeError, match="runs every command as the invoking user"):
            await env.exec("true", user="nobody")
    finally:
        await env.stop(delete=True)
    assert list((tmp_path / "hostdirs").iterdir()) == []


@needs_userns
async def test_rootless_refuses_a_workdir_it_would_have_to_make_in_a_host_directory(tmp_path: Path) -> None:
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path, rootless=True)  # WORKDIR /work/proj: /work is the host's
    with pytest.raises(RuntimeError, match="cannot make /work/proj: /work is the host's own"):
        await env.start(force_build=False)
    assert list((tmp_path / "hostdirs").iterdir()) == []


@needs_userns
def test_rootless_namespace_works_for_an_unprivileged_user(tmp_path: Path) -> None:
    # The orchestration stays in this (root) process, whose Python `nobody` cannot run; the holder
    # script and every exec run as `nobody`, exactly as a non-root tapdeck would spawn them.
    base = Path(tempfile.mkdtemp(prefix="tapdeck-rootless-"))
    base.chmod(0o755)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    holder = None
    try:
        env = _sandbox(tmp_path, rootless=True, base_dir=str(base), task_env={"workdir": "/app"})
        env._make_trial_dirs()
        subprocess.run(["chown", "-R", "65534:65534", str(env.host_root)], check=True)
        rootfs = env.host_root / "rootfs"
        rootfs.mkdir()
        os.chown(rootfs, 65534, 65534)
        holder = subprocess.Popen(
            [*nobody, "unshare", *ROOTLESS_UNSHARE, "--", "bash", "-c", env._rootless_script(rootfs)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(1200):  # a bound for a loaded machine
            assert holder.poll() is None, holder.stderr.read()  # the script failed: say why
            init = [
                pid
                for pid in children(holder.pid)
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
            ]
            if init:
                break
            time.sleep(0.05)
        assert init, "the namespace holder never started its init"
        env._init_pid = init[0]  # only its pid is used, to build the nsenter command
        out = subprocess.run(
            [
                *nobody,
                *env._nsenter(),
                "bash",
                "-c",
                "id -u; cd /app && echo made > here && cat here; ls /proc/self/ns/mnt",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.stdout.split() == ["0", "made", "/proc/self/ns/mnt"], out.stderr
        made = env.host_root / "app" / "here"
        assert made.read_text() == "made\n" and made.stat().st_uid == 65534
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("rootless", MODES)
async def test_no_network_task_gets_loopback_only(rootless: bool, tmp_path: Path) -> None:
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path, rootless=rootless, task_env={"network_mode": "no-network", "workdir": "/app"})
    assert env.no_network
    await env.start(force_build=False)
    try:
        links = await env.exec("ls /sys/class/net")
        assert links.stdout.split() == ["lo"]
        loop = await env.exec(
            'python3 -c \'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); s.listen();'
            ' c=socket.create_connection(s.getsockname()); print("ok")\''
        )
        assert loop.stdout.strip() == "ok"
    finally:
        await env.stop(delete=True)


@pytest.mark.parametrize("rootless", MODES)
async def test_no_network_trial_still_reaches_the_loopback_ports_it_is_given(
    rootless: bool, tmp_path: Path
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readline()
        writer.write(b"host saw " + request)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(
        tmp_path, rootless=rootless, network="none", loopback_ports=[port], task_env={"workdir": "/app"}
    )
    await env.start(force_build=False)
    try:
        talk = (
            'python3 -c \'import socket,sys; c=socket.create_connection(("127.0.0.1", '
            'int(sys.argv[1]))); c.sendall(b"ping\\n"); print(c.makefile().readline().strip())\' '
        )
        reached = await env.exec(talk + str(port), timeout_sec=20)
        assert reached.stdout.strip() == "host saw ping", reached
        links = await env.exec("ls /sys/class/net")
        assert links.stdout.split() == ["lo"]
        other = await env.exec(talk + str(port + 1 if port < 65535 else port - 1), timeout_sec=20)
        assert other.return_code != 0 and "refused" in (other.stderr or "").lower()
    finally:
        await env.stop(delete=True)
        server.close()
        await server.wait_closed()
    assert list((tmp_path / "hostdirs").iterdir()) == []


def test_check_and_preflight_pass_as_root_here() -> None:
    ok, why = host.check()
    assert ok and "(as root)" in why, why
    HostSandbox.preflight()  # passes here (root, util-linux, namespaces allowed)


@needs_userns
def test_check_as_another_user_offers_the_rootless_mode(monkeypatch) -> None:
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    ok, why = host.check()
    assert ok and "rootless" in why, why


def test_check_and_preflight_say_what_is_needed_when_user_namespaces_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    # A system refusing them (the flag stands in for the refusal).
    monkeypatch.setattr(host, "ROOTLESS_UNSHARE", ("--user", "--map-root-user", "--refused"))
    ok, why = host.check()
    assert not ok
    assert "unprivileged user namespaces" in why and "or run as root" in why
    assert "Dockerfile" in why and "NOT a security boundary" in why
    with pytest.raises(SystemExit) as exc:
        HostSandbox.preflight()
    assert "user namespace" in str(exc.value)


def test_capabilities_are_reported_honestly(tmp_path: Path) -> None:
    env = _sandbox(tmp_path)
    caps = env.capabilities
    assert caps.disable_internet
    assert not (caps.gpus or caps.mounted or caps.network_allowlist or caps.docker_compose or caps.windows)


@pytest.mark.slow
async def test_no_network_task_trial_sees_only_loopback(tmp_path: Path, hostdirs: Path) -> None:
    task = tmp_path / "offline-task"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[agent]\ntimeout_sec = 60.0\n'
        "[verifier]\ntimeout_sec = 60.0\n[environment]\n"
        'network_mode = "no-network"\n'
    )
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "environment" / "Dockerfile").write_text("FROM debian:12\nWORKDIR /app\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nls /sys/class/net > /app/links\n")
    (task / "tests" / "test.sh").write_text(
        '#!/bin/bash\n[ "$(cat /app/links)" = "lo" ] && [ "$(ls /sys/class/net)" = "lo" ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    result = await _trial(task, AgentConfig(name="oracle"), tmp_path, "offline__oracle")
    assert _reward(result) == 1.0
    assert list(hostdirs.iterdir()) == []


async def test_root_gets_a_private_home_so_host_dotfiles_stay_out(sandbox: HostSandbox) -> None:
    home = (await sandbox.exec("echo $HOME; ls -A $HOME | wc -l")).stdout.split()
    assert home == [host.PRIVATE_HOME, "0"]
    assert (await sandbox.exec("echo $HOME", user="nobody", cwd="/tmp")).stdout.strip() == "/nonexistent"


@pytest.mark.slow
@pytest.mark.parametrize("rootless", MODES)
async def test_terminus2_drives_tmux_in_the_host_sandbox_and_reaches_the_engine(
    rootless: bool, tmp_path: Path, hostdirs: Path, embedded_engine
) -> None:
    from tapdeck.runner.harnesses import RunDefaults, build_agent_config

    agent = build_agent_config(
        "terminus-2",
        base_urls={"openai": embedded_engine.base_url},
        session_key="tdk-test-key",
        served_model=embedded_engine.served_name,
        defaults=RunDefaults(max_turns=2, max_output_tokens=16, agent_timeout_s=30),
    )
    result = await _trial(SAMPLE.task("hello-file").path, agent, tmp_path, "hello__t2", rootless=rootless)
    # SmolLM2 never solves it: the agent runs out of time, the verifier still grades.
    assert result.exception_info is None or result.exception_info.exception_type == "AgentTimeoutError"
    assert result.verifier_result.rewards == {"reward": 0.0}
    trial_dir = tmp_path / "trials" / "hello__t2"
    assert "root@" in (trial_dir / "agent" / "terminus_2.pane").read_text()  # tmux shell ran
    assert "/app#" in (trial_dir / "agent" / "terminus_2.pane").read_text()
    assert "hit max_tokens limit" in (trial_dir / "trial.log").read_text()  # a reply came back
    assert list(hostdirs.iterdir()) == []


async def test_a_workdir_nested_under_tmp_is_bound_on_top_of_the_private_tmp(tmp_path: Path) -> None:
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path, task_env={"workdir": "/tmp/work"})
    await env.start(force_build=False)
    try:
        await env.exec("echo x > made.txt")
        assert (env.host_root / "tmp__work" / "made.txt").read_text() == "x\n"
        assert (await env.exec("ls /tmp/work")).stdout.split() == ["made.txt"]
    finally:
        await env.stop(delete=True)


_TMUX_TRIAL = '''
import asyncio, os, sys
from harbor import Trial
from harbor.agents.base import BaseAgent
from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from tapdeck.runner.catalog import sandbox_environment_config


class TmuxAgent(BaseAgent):
    """Starts terminus-2's tmux session (a daemonised server), says so, then works for a long time."""

    @staticmethod
    def name() -> str:
        return "tapdeck-tmux"

    def version(self) -> str:
        return "1"

    async def setup(self, environment) -> None:
        return None

    async def run(self, instruction, environment, context) -> None:
        tmux = await environment.exec("tmux new-session -d -s terminus-2 -x 80 -y 24 'sleep 600'")
        assert tmux.return_code == 0, tmux.stderr
        print("tmux started", flush=True)
        await asyncio.sleep(600)


async def main(task, trials, base, rootless):
    config = TrialConfig(task=TaskConfig(path=task), trials_dir=trials, trial_name="tmux",
                         agent=AgentConfig(import_path="__main__:TmuxAgent"),
                         environment=sandbox_environment_config("host", base_dir=base,
                                                                rootless=rootless == "1"))
    await (await Trial.create(config)).run()


asyncio.run(main(*sys.argv[1:]))
'''


@pytest.mark.slow
@pytest.mark.parametrize("rootless", MODES)
def test_kill_9_of_the_server_kills_every_process_of_its_trial_tmux_included(
    rootless: bool, tmp_path: Path, hostdirs: Path
) -> None:
    from tests.support.processes import SandboxProcesses

    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _TMUX_TRIAL,
            str(SAMPLE.task("hello-file").path),
            str(tmp_path / "trials"),
            str(hostdirs),
            "1" if rootless else "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    trial = None
    try:
        line = server.stdout.readline()  # the agent's line, or "" if the process died first
        assert line == "tmux started\n", server.stderr.read() if server.poll() is not None else line
        trial = SandboxProcesses(server.pid)
        assert any(c.startswith("tmux") for c in trial.commands()), trial.commands()
        os.kill(server.pid, signal.SIGKILL)
        server.wait(30)
        assert trial.survivors() == []
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if trial is not None:
            trial.close()


_HELD_SANDBOX = """
import asyncio, logging, sys
from pathlib import Path
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths
from tapdeck.runner.sandboxes.host import HostSandbox


async def main(task_dir, base_dir):
    trial_paths = TrialPaths(Path(task_dir) / "killed-trial")
    trial_paths.mkdir()
    env = HostSandbox(environment_dir=Path(task_dir) / "environment", environment_name="t",
                      session_id="killed__env", trial_paths=trial_paths,
                      task_env_config=EnvironmentConfig(workdir="/app"),
                      logger=logging.getLogger("killed"), base_dir=base_dir)
    await env.start(force_build=False)
    await env.exec("echo work > /app/made.txt")
    print(env.host_root, flush=True)
    await asyncio.sleep(600)


asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.medium
async def test_the_trial_folders_a_killed_process_left_are_removed_when_the_next_trial_starts(
    tmp_path: Path,
) -> None:
    (tmp_path / "hostdirs").mkdir()
    live = _sandbox(tmp_path)  # a trial of this process, alive throughout: never swept
    await live.start(force_build=False)
    killed = subprocess.Popen(
        [sys.executable, "-c", _HELD_SANDBOX, str(tmp_path / "task"), str(tmp_path / "hostdirs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = killed.stdout.readline()
        assert line.strip(), killed.stderr.read() if killed.poll() is not None else line
        left = Path(line.strip())
        assert (left / "app" / "made.txt").read_text() == "work\n"
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(30)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    assert left.is_dir()  # nothing of the killed process could remove it
    following = _sandbox(tmp_path)
    await following.start(force_build=False)
    try:
        assert not left.exists(), "the dead process's trial folder was left on the host"
        assert live.host_root.is_dir() and following.host_root.is_dir()
    finally:
        await following.stop(delete=True)
        await live.stop(delete=True)
    assert list((tmp_path / "hostdirs").iterdir()) == []


async def test_a_trial_folder_kept_on_purpose_is_never_removed_by_a_later_trial(tmp_path: Path) -> None:
    (tmp_path / "hostdirs").mkdir()
    kept = _sandbox(tmp_path)
    await kept.start(force_build=False)
    root = kept.host_root
    await kept.stop(delete=False)
    following = _sandbox(tmp_path)
    await following.start(force_build=False)
    await following.stop(delete=True)
    assert root.is_dir()
    shutil.rmtree(root)


@pytest.mark.parametrize("rootless", MODES)
async def test_a_hidden_host_directory_shows_empty_and_read_only_in_the_trial(
    rootless: bool, tmp_path: Path
) -> None:
    # Outside /tmp, which every trial already has its own of (as ~/.tapdeck is).
    hidden = Path(tempfile.mkdtemp(prefix="tapdeck-hidden-", dir="/var/tmp"))
    try:
        (hidden / "admin.key").write_text("tdk-admin-secret\n")
        (tmp_path / "hostdirs").mkdir()
        env = _sandbox(tmp_path, rootless=rootless, hidden_paths=[str(hidden)], task_env={"workdir": "/app"})
        await env.start(force_build=False)
        try:
            seen = await env.exec(f"ls -A {hidden}; cat {hidden}/admin.key; touch {hidden}/planted; echo end")
        finally:
            await env.stop(delete=True)
        assert seen.stdout.split() == ["end"], seen
        assert sorted(os.listdir(hidden)) == ["admin.key"]  # nothing written through
    finally:
        shutil.rmtree(hidden)


async def test_a_command_printing_without_end_returns_only_its_last_output(tmp_path: Path) -> None:
    (tmp_path / "hostdirs").mkdir()
    env = _sandbox(tmp_path, output_limit_bytes=1 << 20)
    streamed = {"stdout": 0, "stderr": 0}

    async def count(text: str, stream: str) -> None:
        streamed[stream] += len(text)

    await env.start(force_build=False)
    try:
        with env.scoped_output_callback(count):
            result = await env.exec(
                "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo last-line; "
                "head -c 3000000 /dev/zero | tr '\\0' y >&2; echo err-end >&2"
            )
    finally:
        await env.stop(delete=True)
    assert result.return_code == 0
    assert result.stdout.endswith("x\nlast-line\n") and result.stderr.endswith("yyerr-end\n")
    note, _, kept = result.stdout.partition("\n")
    assert "bytes of this output were cut" in note and len(kept) == 1 << 20
    assert len(result.stderr.partition("\n")[2]) == 1 << 20
    assert streamed == {"stdout": 20_000_011, "stderr": 3_000_008}  # the callback got everything


def test_a_task_whose_compose_file_starts_other_services_is_refused_naming_them(tmp_path: Path) -> None:
    compose = tmp_path / "task" / "environment" / "docker-compose.yaml"
    compose.parent.mkdir(parents=True)
    compose.write_text("services:\n  main:\n    build: .\n")
    assert _sandbox(tmp_path).workdir == "/work/proj"  # `main` alone: ignored like the Dockerfile
    compose.write_text(
        "services:\n  main:\n    build: .\n  db:\n    image: postgres:16\n  cache:\n    image: redis:7\n"
    )
    with pytest.raises(
        ValueError,
        match=r"cannot start compose service\(s\) db, cache: use a "
        r"container sandbox \(--sandbox docker\)",
    ):
        _sandbox(tmp_path)
    compose.write_text("services: [main\n")
    with pytest.raises(ValueError, match="docker-compose.yaml is not a docker compose file"):
        _sandbox(tmp_path)


@pytest.mark.medium
async def test_trials_cut_off_from_the_network_each_serve_the_same_port_on_their_own_loopback(
    tmp_path: Path,
) -> None:
    # On the host's network two trials serving one fixed port collide (the second's verifier then
    # grades the first's server); `network="none"` gives each trial a loopback of its own.
    (tmp_path / "hostdirs").mkdir()
    trials = [_sandbox(tmp_path, network="none", task_env={"workdir": "/app"}) for _ in range(2)]
    fetch = (
        "python3 -c 'import time, urllib.request\n"
        "for _ in range(600):\n"
        "    try:\n"
        '        print(urllib.request.urlopen("http://127.0.0.1:18765/id.txt").read().decode()); break\n'
        "    except OSError:\n"
        "        time.sleep(0.1)'"
    )
    try:
        for i, trial in enumerate(trials):
            await trial.start(force_build=False)
            started = await trial.exec(
                f"echo trial{i} > id.txt; (nohup python3 -m http.server 18765 >/dev/null 2>&1 &)"
            )
            assert started.return_code == 0, started
        served = [(await trial.exec(fetch, timeout_sec=120)).stdout.strip() for trial in trials]
    finally:
        for trial in trials:
            await trial.stop(delete=True)
    assert served == ["trial0", "trial1"]


@pytest.mark.parametrize("rootless", MODES)
async def test_trials_whose_folders_lie_outside_tmp_cannot_reach_each_others_workspace(
    rootless: bool, tmp_path: Path
) -> None:
    # A base dir outside /tmp (TMPDIR=/var/tmp, say) is not covered by the trial's private /tmp.
    base = Path(tempfile.mkdtemp(prefix="tapdeck-base-", dir="/var/tmp"))
    try:
        first, second = (
            _sandbox(tmp_path, rootless=rootless, base_dir=str(base), task_env={"workdir": "/app"})
            for _ in range(2)
        )
        await first.start(force_build=False)
        await second.start(force_build=False)
        try:
            await first.exec("echo first-answer > /app/answer.txt")
            seen = await second.exec(
                f"ls -A {base}; cat {base}/*/app/answer.txt; touch {base}/planted; echo end"
            )
            assert (await second.exec(f"ls {base}")).stdout.split() == ["planted"]  # its own, private
        finally:
            await second.stop(delete=True)
            await first.stop(delete=True)
        assert seen.stdout.split() == ["end"], seen
        assert sorted(os.listdir(base)) == []  # nothing written through, nothing left
    finally:
        shutil.rmtree(base)
