"""The catalog (what this machine can run) and `tapdeck info`."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.commands.info import render
from tapdeck.runner import catalog
from tests.support.fake_vllm import models_only_engine


def test_sandbox_catalog_lists_host_and_every_harbor_backend() -> None:
    from harbor.models.environment_type import EnvironmentType

    rows = {r.name: r for r in catalog.sandbox_catalog(refresh=True)}
    assert set(rows) == {"host"} | {t.value for t in EnvironmentType}
    assert rows["host"].available and rows["host"].import_path.endswith(":HostSandbox")
    assert "NOT a security boundary" in rows["host"].why and "Dockerfile" in rows["host"].why
    # Docker is as its own check finds it (ready where scripts/container-sandbox.sh ran).
    from tapdeck.runner.sandboxes.docker_sandbox import check

    assert (rows["docker"].available, rows["docker"].why) == check()
    for row in rows.values():
        assert row.why


def test_missing_sdk_reason_keeps_the_install_command_after_its_colon() -> None:
    from harbor.models.environment_type import EnvironmentType

    missing = [row for row in catalog.sandbox_catalog(refresh=True) if "Install it with" in row.why]
    # Harbor's optional sandbox SDKs (vercel, blaxel, ...) are not in tapdeck's environment.
    assert missing and {r.name for r in missing} <= {t.value for t in EnvironmentType}
    for row in missing:
        assert not row.why.rstrip().endswith(":"), row.why
        assert "pip install" in row.why, row.why


def test_sandbox_environment_config_for_host_and_harbor_types() -> None:
    host = catalog.sandbox_environment_config("host", network="none")
    assert host.import_path == catalog.HOST_IMPORT_PATH and host.kwargs == {"network": "none"}
    assert catalog.sandbox_environment_config("docker").type.value == "docker"
    with pytest.raises(ValueError, match="unknown sandbox"):
        catalog.sandbox_environment_config("nope")


def test_harness_availability_follows_the_sandboxes() -> None:
    host_only = [catalog.SandboxInfo(name="host", available=True, why="")]
    rows = {r.name: r for r in catalog.harness_catalog(host_only)}
    assert rows["oracle"].available and rows["terminus-2"].available
    assert not rows["goose"].available and "no container sandbox" in rows["goose"].why
    with_docker = host_only + [catalog.SandboxInfo(name="docker", available=True, why="")]
    assert {r.name: r for r in catalog.harness_catalog(with_docker)}["goose"].available


def test_agent_clis_need_the_host_sandbox_and_say_what_is_installed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TAPDECK_AGENTS_DIR", str(tmp_path))
    host = [catalog.SandboxInfo(name="host", available=True, why="")]
    codex = {r.name: r for r in catalog.harness_catalog(host)}["codex"]
    assert codex.placement == "host-install" and codex.version == "0.169.0"
    assert codex.installed is None and "tapdeck harness install codex" in codex.why
    no_host = [catalog.SandboxInfo(name="host", available=False, why="no namespaces")]
    codex = {r.name: r for r in catalog.harness_catalog(no_host)}["codex"]
    assert not codex.available and "needs the host or docker sandbox" in codex.why
    docker = [*no_host, catalog.SandboxInfo(name="docker", available=True, why="")]
    codex = {r.name: r for r in catalog.harness_catalog(docker)}["codex"]
    assert codex.available, codex.why  # its install is mounted into the container


def test_dataset_catalog_reports_errors_instead_of_raising(tmp_path) -> None:
    rows = catalog.dataset_catalog([str(tmp_path / "missing")])
    assert [(r.name, len(r.tasks), r.error) for r in rows[:3]] == [
        ("sample", 5, None),
        ("learn", 8, None),
        ("learn-eval", 4, None),
    ]
    assert rows[3].tasks == [] and "does not exist" in rows[3].error


def test_embedded_engine_is_available_without_starting_it_and_claims_no_tier() -> None:
    info = catalog.embedded_engine_info()
    assert info.reachable and "not started" in info.why
    assert info.tier is None  # unprobed: never assume the stronger tier


def test_ec2_without_aws_credentials_is_unavailable_though_harbor_preflight_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    ok, why = catalog._check_harbor_environment("ec2")
    assert not ok and "AWS credentials" in why
    if shutil.which("ssh") is None:
        pytest.skip("Harbor's own ec2 preflight needs the ssh client")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-test")
    ok, why = catalog._check_harbor_environment("ec2")
    assert ok, why


def test_opensandbox_without_a_server_domain_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENSANDBOX_DOMAIN", raising=False)
    ok, why = catalog._check_harbor_environment("opensandbox")
    assert not ok


def test_unreachable_engine_url_is_reported_not_raised() -> None:
    info = asyncio.run(catalog.url_engine_info("http://127.0.0.1:9/v1"))
    assert not info.reachable and info.tier is None and "127.0.0.1:9" in info.why


def test_an_engine_address_is_shown_without_its_credentials() -> None:
    info = asyncio.run(catalog.url_engine_info("http://user:secret@127.0.0.1:9/v1"))
    assert "secret" not in info.name + info.why and info.name == "http://***@127.0.0.1:9/v1"
    with models_only_engine() as engine:
        answering = engine.replace("http://", "http://user:secret@")
        for probe in (False, True):
            info = asyncio.run(catalog.url_engine_info(answering, probe=probe))
            assert info.reachable and "secret" not in info.name + info.why, info.why


def test_a_named_model_is_probed_on_an_engine_serving_several() -> None:
    from tests.support.fake_vllm import FakeVllm, vllm_listing

    with FakeVllm(listing=vllm_listing(served=["smollm2", "smollm2-lora"])) as up:
        unnamed = asyncio.run(catalog.url_engine_info(up.base_url))
        named = asyncio.run(catalog.url_engine_info(up.base_url, model="smollm2"))
    assert unnamed.tier == "text" and "several models" in unnamed.why
    assert named.tier == "tokens" and named.served_model == "smollm2", named.why


def test_engine_listing_without_probe_counts_as_text_tier() -> None:
    with models_only_engine() as engine:
        info = asyncio.run(catalog.url_engine_info(engine, probe=False))
    assert info.reachable and info.served_model == "smollm2"
    assert info.tier == "text" and "not probed" in info.why
    assert info.url == f"{engine}/v1" and info.why.startswith(f"{engine}/v1 serves smollm2")


def test_info_command_prints_the_base_url_a_bare_engine_address_settled_on() -> None:
    with models_only_engine() as engine:
        address = engine.removeprefix("http://")
        result = CliRunner().invoke(
            app, ["info", "--engine", address, "--no-probe"], env={"COLUMNS": "100", "TERM": "dumb"}
        )
    assert result.exit_code == 0, result.output
    assert f"{engine}/v1 serves smollm2" in result.output


@pytest.mark.slow
def test_engine_url_tier_comes_from_the_proxy_probe(embedded_engine) -> None:
    info = asyncio.run(catalog.url_engine_info(embedded_engine.base_url))
    assert info.reachable and info.served_model == "smollm2"
    assert info.tier == "tokens", info.why


def test_info_command_fits_80_columns_and_says_what_matters() -> None:
    result = CliRunner().invoke(
        app, ["info", "--engine", "http://127.0.0.1:9/v1"], env={"COLUMNS": "80", "TERM": "dumb"}
    )
    # The catalog is printed in full, and the engine named that does not answer makes it exit 1.
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("tapdeck info: no engine answered at 'http://127.0.0.1:9/v1'")
    out = result.stdout
    for needle in (
        "Sandboxes",
        "host",
        "NOT a security boundary",
        "Dataset sample (5 tasks)",
        "hello-file",
        "Harnesses",
        "terminus-2",
        "Engines",
        "embedded",
        "127.0.0.1:9",
        "defaults: dataset=sample harness=terminus-2 sandbox=host",
    ):
        assert needle in out, needle
    assert max(len(line) for line in out.splitlines()) <= 80


def test_info_engine_that_does_not_answer_says_on_stderr_what_was_tried_and_what_to_check() -> None:
    result = CliRunner().invoke(app, ["info", "--engine", "127.0.0.1:9", "--no-probe", "--json"])
    assert result.exit_code == 1, result.output
    row = next(e for e in json.loads(result.stdout)["engines"] if e["name"] == "127.0.0.1:9")
    tried = ("GET http://127.0.0.1:9/v1/models (", "GET http://127.0.0.1:9/models (")
    assert all(url in row["why"] for url in tried), row["why"]
    # One line: the row's own words (every URL tried and its answer), then what to check.
    assert result.stderr == (
        f"tapdeck info: {row['why']}; check that the engine is running at "
        "that host and port, and that --engine-api-key is its key if it "
        "wants one\n"
    )


def test_info_json_is_the_catalog_document() -> None:
    result = CliRunner().invoke(app, ["info", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) == {
        "datasets",
        "harnesses",
        "sandboxes",
        "engines",
        "defaults",
        "settings_defaults",
        "harness_defaults",
    }
    assert doc["settings_defaults"]["max_turns"] == "3"
    assert doc["defaults"] == {
        "dataset": "sample",
        "harness": "terminus-2",
        "sandbox": "host",
        "engine": "embedded",
    }
    assert {"name", "dialect", "placement", "validated", "available", "why"} <= set(doc["harnesses"][0])


def test_render_hides_unavailable_backends_unless_asked() -> None:
    cat = catalog.build_catalog()
    console = Console(width=80, record=True, color_system=None)
    for part in render(cat, show_all=False):
        console.print(part)
    short = console.export_text()
    for part in render(cat, show_all=True):
        console.print(part)
    full = console.export_text()
    assert "--all lists them" in short and "e2b" not in short and "e2b" in full


def test_sandbox_checks_that_print_out_of_order_leave_the_commands_output_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys
    import threading

    from harbor.environments.base import BaseEnvironment

    # Two preflights that print and overlap, the first ending before the second: the order that
    # left sys.stdout on a check's buffer when each check swapped the process-wide stream.
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    class First(BaseEnvironment):
        @classmethod
        def preflight(cls) -> None:
            print("first preflight talking")
            first_in.set()
            second_in.wait(10)
            first_out.set()

    class Second(BaseEnvironment):
        @classmethod
        def preflight(cls) -> None:
            first_in.wait(10)
            print("second preflight talking", file=sys.stderr)
            second_in.set()
            first_out.wait(10)

    classes = {"daytona": First, "modal": Second}
    monkeypatch.setattr(catalog, "_SANDBOX_CACHE", {})  # these rows are not this machine's
    monkeypatch.setattr(catalog, "harbor_environment_types", lambda: list(classes))
    monkeypatch.setattr(
        "harbor.environments.factory._load_environment_class", lambda env_type: classes[env_type.value]
    )
    stdout, stderr = sys.stdout, sys.stderr
    rows = {r.name: r for r in catalog.sandbox_catalog(refresh=True)}
    assert rows["daytona"].available and rows["modal"].available
    assert (sys.stdout, sys.stderr) == (stdout, stderr)
    print("the command's own output")
    said = capsys.readouterr()
    assert said.out == "the command's own output\n" and "preflight" not in said.err
