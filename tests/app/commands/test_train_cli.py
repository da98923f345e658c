"""`tapdeck train` through the real console script, against a real tapdeck server's training API."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.trackio_runs import EVAL_SUMMARY
from tests.support.training_export import write_export

TAPDECK = shutil.which("tapdeck", path=str(Path(os.sys.executable).parent)) or "tapdeck"


def train(server: Any, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TAPDECK, "train", "--server", server.url, "--admin-key", server.admin_key, *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.medium
def test_train_list_says_what_the_server_can_start(train_server: Any, tmp_path: Path) -> None:
    out = subprocess.run(
        [TAPDECK, "train", "--server", train_server.url, "--admin-key", train_server.admin_key, "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TAPDECK_TRAIN_ENV": str(tmp_path / "none")},
    )
    assert out.returncode == 0, out.stderr
    assert "data-check  [can start there]" in out.stdout
    # The server's environment decides (the test server runs in this process, without the variable).
    assert "cpu-grpo  [" in out.stdout and "updates weights: yes" in out.stdout
    assert "cpu-grpo updates SmolLM2-135M's weights on a CPU" in out.stdout


@pytest.mark.medium
def test_a_recipe_that_needs_gpus_cannot_start_on_a_server_without_them(
    train_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server runs in this process: with no GPU visible to it, grpo-trl (vLLM + trainer) cannot start.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = train(train_server, "--list")
    assert out.returncode == 0, out.stderr
    assert "grpo-trl  [cannot start there]" in out.stdout
    assert "data-check  [can start there]" in out.stdout
    launched = train(train_server, "--recipe", "grpo-trl")
    assert launched.returncode != 0
    assert (
        "grpo-trl needs 2 GPUs (1 for vLLM, 1 for the trainer, not shared); the server has 0 usable "
        "(no GPU; device nodes in /dev: "
    ) in launched.stderr
    assert "CUDA_VISIBLE_DEVICES='')" in launched.stderr


def test_gpu_count_decides_a_gpu_recipe_is_unavailable_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from tapdeck.runner.recipes import RECIPES, Recipe
    from tapdeck.runner.train_jobs import recipe_info

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("TAPDECK_DEV_DIR", "/dev")
    needs_two = Recipe(
        name="gpu-recipe", module="m", summary="", where="GPU box", updates_weights=True, gpu_split=True
    )
    info = recipe_info(needs_two)
    assert not info.available
    assert info.why.startswith("gpu-recipe needs 2 GPUs (1 for vLLM, 1 for the trainer, not shared)")
    assert recipe_info(RECIPES["data-check"]).available  # no GPU asked, none needed
    assert RECIPES["grpo-trl"].gpu_split


@pytest.mark.medium
def test_train_with_an_unknown_recipe_is_bad_usage(train_server: Any) -> None:
    out = train(train_server, "--recipe", "bogus")
    assert out.returncode == 2
    assert "unknown recipe 'bogus'; known: data-check" in out.stderr


@pytest.mark.medium
def test_train_with_a_rejected_admin_key_names_where_that_key_came_from(
    train_server: Any, tmp_path: Path
) -> None:
    given = subprocess.run(
        [
            TAPDECK,
            "train",
            "--server",
            train_server.url,
            "--data-dir",
            str(tmp_path / "empty"),
            "--admin-key",
            "not-the-key",
            "--list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert given.returncode == 1
    assert "the server rejected the admin key from --admin-key or $TAPDECK_ADMIN_KEY" in given.stderr
    assert str(tmp_path) not in given.stderr  # the data dir's admin.key was not what was sent
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "admin.key").write_text("not-the-key\n")
    read = subprocess.run(
        [TAPDECK, "train", "--server", train_server.url, "--data-dir", str(tmp_path / "client"), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TAPDECK_ADMIN_KEY"},
    )
    assert read.returncode == 1
    assert (
        f"tapdeck train: the server rejected the admin key read from "
        f"{tmp_path / 'client' / 'admin.key'}; pass the server's key with --admin-key"
    ) in read.stderr


@pytest.mark.medium
def test_train_streams_the_log_and_prints_final_metrics(train_server: Any, tmp_path: Path) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    out = train(train_server, "--rows", str(rows))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step 2: group 2" in out.stdout and "\x1b[" not in out.stdout
    assert "  train/reward = 0.5 (step 2)" in out.stdout
    assert "finished (exit code 0)" in out.stdout
    assert str(tmp_path / "data" / "train") in out.stdout  # it ran in the server's data dir


@pytest.mark.medium
def test_train_ends_with_the_eval_verifier_reward_before_and_after(
    train_server: Any, eval_recipe: str
) -> None:
    out = train(train_server, "--recipe", eval_recipe)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "eval-recipe: logged step 3" in lines and "  train/reward = 0.7 (step 3)" in lines
    assert lines[-1] == f"[tapdeck] {EVAL_SUMMARY}"


@pytest.mark.medium
def test_train_of_a_run_that_logged_no_eval_says_nothing_of_one(train_server: Any, eval_recipe: str) -> None:
    out = train(train_server, "--recipe", eval_recipe, "--no-eval")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "  train/reward = 0.7 (step 3)" in lines and "finished (exit code 0)" in out.stdout
    assert lines[-1] == "  train/loss = 0.166667 (step 3)"  # the headline metrics end it, as before
    assert "verifier reward" not in out.stdout + out.stderr


@pytest.mark.medium
def test_train_output_leaves_out_trackios_upload_line_as_nothing_is_uploaded(
    train_server: Any, tmp_path: Path
) -> None:
    # trackio prints it at finish() while it writes to the run's local TRACKIO_DIR.
    rows = write_export(tmp_path / "rows.jsonl")
    out = train(train_server, "--rows", str(rows), "--step-delay", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step 2: group 2" in out.stdout and "data-check: summary" in out.stdout
    assert "Uploading logs" not in out.stdout + out.stderr
    log = next((Path(train_server.config.data_dir) / "train").glob("t-*/train.log")).read_text()
    assert "Uploading logs" not in log and "data-check: summary" in log


@pytest.mark.medium
def test_train_output_gives_the_trackio_show_command_that_shows_this_job(
    train_server: Any, tmp_path: Path
) -> None:
    # trackio's own `trackio show --project "tapdeck"` reads its default folder, not the job's.
    rows = write_export(tmp_path / "rows.jsonl")
    out = train(train_server, "--rows", str(rows))
    assert out.returncode == 0, out.stdout + out.stderr
    [job] = (Path(train_server.config.data_dir) / "train").glob("t-*")
    [line] = [text for text in out.stdout.splitlines() if " show --project " in text]
    assert "trackio.show(" not in out.stdout  # its Python variant, wrong the same way, is left out
    assert line in (job / "train.log").read_text().splitlines()
    setting, *command = shlex.split(line)
    assert setting == f"TRACKIO_DIR={job / 'trackio'}"
    assert command == [str(Path(os.sys.executable).parent / "trackio"), "show", "--project", "tapdeck"]
    # Run as told, headless (no browser, a free port), it serves this job's trackio run.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "TRACKIO_DIR": setting.split("=", 1)[1],
        "BROWSER": "true",
        "GRADIO_SERVER_PORT": str(port),
        "HF_HOME": str(tmp_path / "hf"),
    }
    show = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert show.stdout is not None
        url = next((m[0] for text in show.stdout if (m := re.search(r"http://127\.0\.0\.1:\d+", text))), None)
        assert url is not None, "trackio show printed no address"
        runs = httpx.post(f"{url}/api/get_runs_for_project", json={"data": ["tapdeck"]}, timeout=60)
        assert [r["name"] for r in runs.json()["data"]] == [job.name]
    finally:
        show.terminate()
        show.wait(timeout=60)


@pytest.mark.medium
def test_train_on_an_unknown_run_is_a_clear_error(train_server: Any) -> None:
    out = train(train_server, "--run", "r-missing")
    assert out.returncode == 1 and "no rollout run 'r-missing'" in out.stderr


@pytest.mark.medium
def test_a_recipe_that_dies_prints_why(train_server: Any, tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text("not json\n")
    out = train(train_server, "--rows", str(garbled))
    assert out.returncode == 1
    assert "failed (exit code 2)" in out.stdout and f"why: data-check: {garbled}:1" in out.stdout


@pytest.mark.medium
def test_train_with_rows_that_are_not_there_is_refused_before_a_job_starts(
    train_server: Any, tmp_path: Path
) -> None:
    jobs = Path(train_server.config.data_dir) / "train"
    missing = tmp_path / "missing.jsonl"
    out = train(train_server, "--rows", str(missing))
    assert out.returncode == 2, out.stdout + out.stderr
    # The server checks its own machine's path (the TUI's launch gets the same 422).
    assert out.stderr.strip().splitlines() == [
        f"tapdeck train: POST /admin/train refused (422): data-check: argument --rows: no export "
        f"file at {missing} (its options: tapdeck train --recipe data-check -- --help)"
    ]
    assert not jobs.is_dir() or not any(jobs.iterdir())


@pytest.mark.medium
def test_train_without_the_rows_its_recipe_reads_is_refused_before_a_job_starts(
    train_server: Any, tmp_path: Path
) -> None:
    jobs = Path(train_server.config.data_dir) / "train"
    before = set(jobs.iterdir()) if jobs.is_dir() else set()
    out = train(train_server, "--step-delay", "0")  # the default recipe, data-check, given no rows
    assert out.returncode == 2, out.stdout + out.stderr
    assert "tapdeck train: data-check needs --run RUN (or --rows PATH)" in out.stderr
    assert (set(jobs.iterdir()) if jobs.is_dir() else set()) == before
    # Without --server it is refused before a local server starts in the data dir.
    local = subprocess.run(
        [TAPDECK, "train", "--data-dir", str(tmp_path / "local")], capture_output=True, text=True, timeout=60
    )
    assert local.returncode == 2 and "data-check needs --run RUN" in local.stderr, local.stderr
    assert not (tmp_path / "local").exists()


@pytest.mark.parametrize("args", [["--rows", "r.jsonl"], ["--rows=r.jsonl"], ["--run", "run-1"], ["--help"]])
def test_recipe_args_that_name_its_rows_stand_in_for_run(args: list[str]) -> None:
    from tapdeck.runner.recipes import DEFAULT_RECIPE, RECIPES

    check = RECIPES[DEFAULT_RECIPE]
    assert check.rows_missing(None, args) is None
    assert check.rows_missing("run-1", []) is None
    assert check.rows_missing(None, ["--step-delay", "0"]) == "data-check needs --run RUN (or --rows PATH)"
    assert RECIPES["cpu-grpo"].rows_missing(None, []) is None  # it reads no exported rows


@pytest.mark.medium
def test_train_refuses_recipe_args_its_parser_refuses_as_bad_usage_before_a_job_starts(
    train_server: Any, tmp_path: Path
) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    jobs = Path(train_server.config.data_dir) / "train"
    typo = train(train_server, "--rows", str(rows), "--bogus", "3")
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert typo.stderr.strip().splitlines() == [
        "tapdeck train: POST /admin/train refused (422): data-check: unrecognized arguments: "
        "--bogus 3 (its options: tapdeck train --recipe data-check -- --help)"
    ]
    # A value of the wrong type, for the CPU training recipe: refused before its model loads.
    steps = train(train_server, "--recipe", "cpu-grpo", "--steps", "one")
    assert steps.returncode == 2, steps.stdout + steps.stderr
    assert "cpu-grpo: argument --steps: 'one' is not a whole number" in steps.stderr
    assert not jobs.is_dir() or not any(p.name.startswith("t-") for p in jobs.iterdir())


def test_a_recipes_usage_check_leaves_help_to_the_job_and_takes_what_it_parses(tmp_path: Path) -> None:
    from tapdeck.runner.recipes import RECIPES

    rows = write_export(tmp_path / "rows.jsonl")
    assert RECIPES["cpu-grpo"].usage_error(["--help"]) is None  # the job prints it
    assert RECIPES["cpu-grpo"].usage_error(["--tasks", "hello-file", "--steps", "1"]) is None
    assert RECIPES["grpo-trl"].usage_error(["--run", "run-1"]) is None
    assert RECIPES["data-check"].usage_error(["--rows", str(rows), "--step-delay", "0"]) is None
    assert "argument --rows: no export file at" in RECIPES["data-check"].usage_error(
        ["--rows", str(tmp_path / "missing.jsonl")]
    )


@pytest.mark.medium
def test_train_into_a_data_dir_whose_train_folder_cannot_be_written_says_so_in_one_line(
    train_server: Any, tmp_path: Path
) -> None:
    rows = write_export(tmp_path / "rows.jsonl")
    jobs = Path(train_server.config.data_dir) / "train"
    jobs.write_text("")  # a file where the runs' folder goes
    out = train(train_server, "--rows", str(rows))
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        f"tapdeck train: POST /admin/train refused (400): cannot write the training run's files "
        f"under {jobs} (Not a directory)"
    ]


@pytest.mark.medium
def test_cpu_grpo_refuses_numbers_out_of_range_before_its_model_loads(train_server: Any) -> None:
    from tapdeck.runner.recipes import RECIPES

    # A group of 1 has no advantage to compute: TRL's config died of it after the model loaded.
    out = train(train_server, "--recipe", "cpu-grpo", "--group-size", "1", "--steps", "1")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "cpu-grpo: argument --group-size: 1 is below 2" in out.stderr
    check = RECIPES["cpu-grpo"].usage_error
    assert "argument --group-size: 0 is below 2" in check(["--group-size", "0"])
    assert "argument --steps: 0 is below 1" in check(["--steps", "0"])
    assert "argument --lr: 0 is not a finite number above 0" in check(["--lr", "0"])
    assert "argument --temperature: nan is not a finite number above 0" in check(["--temperature", "nan"])
    assert check(["--group-size", "2", "--redraws", "0", "--lr", "1e-4"]) is None
