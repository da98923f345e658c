"""Every factual claim of the README and of docs/, and the test that fails if it stops being true.

The claims are listed in `tests/readme_claims.md` (its opening says how): one block per document,
one section per heading, each claim with the tests that pin it. The tests here check that list
against the documents and the suite, follow links between the documents, and pin the claims that
are read straight from a document (the command tables, the data dir listing, pinned versions,
admin routes, the settings' defaults).
"""

from __future__ import annotations

import itertools
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "tests" / "readme_claims.md"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAMED = re.compile(r"^(tests/[\w/]+\.py)(?:::(\w+))?$")
# Entries that name no test, and say why.
UNTESTED = ("unpinned:", "measured:", "none:")


def _read(name: str) -> str:
    return (ROOT / name).read_text()


@dataclass
class Entry:
    text: str
    tests: list[str] = field(default_factory=list)


@dataclass
class Section:
    heading: str
    entries: list[Entry] = field(default_factory=list)


def _claims() -> dict[str, list[Section]]:
    """`tests/readme_claims.md` read: each document's sections in order, each with its entries."""
    documents: dict[str, list[Section]] = {}
    sections: list[Section] | None = None
    for number, line in enumerate(CLAIMS.read_text().splitlines(), 1):
        where = f"{CLAIMS.name}:{number}"
        if line.startswith("## "):
            sections = documents.setdefault(line[3:].strip(), [])
        elif sections is None or not line.strip():
            continue  # the file's opening, or a blank line
        elif line.startswith("§ "):
            sections.append(Section(line[2:].strip()))
        elif line.startswith("- "):
            assert sections, f"{where}: an entry before any § section"
            sections[-1].entries.append(Entry(line[2:].strip()))
        elif line.startswith("  → "):
            assert sections and sections[-1].entries, f"{where}: a test before any entry"
            sections[-1].entries[-1].tests.append(line[4:].strip())
        elif line.startswith("  "):
            assert sections and sections[-1].entries, f"{where}: a continuation before any entry"
            sections[-1].entries[-1].text += " " + line.strip()
        else:
            raise AssertionError(f"{where}: not a section, entry or test: {line!r}")
    return documents


def _prose(text: str) -> str:
    """A document without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _headings(text: str) -> list[str]:
    """A document's headings (`#` to `###`), code blocks left out."""
    return [line.strip("# ").strip() for line in _prose(text).splitlines() if re.match(r"^#{1,3} \S", line)]


def _section(text: str, heading: str) -> str:
    """The body of one heading (`## Name`), up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    body = ("\n" + _prose(text)).split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{level}}} ", "\n" + body, maxsplit=1)[0]


def _table(text: str) -> str:
    """The first table in `text`: its consecutive `|` lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def test_every_named_test_exists() -> None:
    named = [
        test
        for sections in _claims().values()
        for section in sections
        for entry in section.entries
        for test in entry.tests
    ]
    assert len(named) > 100
    missing = []
    for test in named:
        match = NAMED.match(test)
        if (
            not match
            or not (ROOT / match[1]).is_file()
            or (
                match[2]
                and not re.search(rf"^(async )?def {match[2]}\(", (ROOT / match[1]).read_text(), re.M)
            )
        ):
            missing.append(test)
    assert not missing, missing


def test_every_section_of_the_readme_and_docs_lists_its_claims() -> None:
    claims = _claims()
    documents = {str(path.relative_to(ROOT)) for path in DOCUMENTS}
    assert "README.md" in documents and len(documents) > 5
    assert sorted(claims) == sorted(documents)
    for name in sorted(documents):
        listed = [section.heading for section in claims[name]]
        assert listed == _headings(_read(name)), name


def test_every_claim_names_a_test_or_says_why_not() -> None:
    empty = [
        f"{name} § {section.heading}"
        for name, sections in _claims().items()
        for section in sections
        if not section.entries
    ]
    untested = [
        f"{name} § {section.heading}: {entry.text[:60]}"
        for name, sections in _claims().items()
        for section in sections
        for entry in section.entries
        if not entry.tests and not entry.text.startswith(UNTESTED)
    ]
    said_why_and_tested = [
        entry.text[:60]
        for sections in _claims().values()
        for section in sections
        for entry in section.entries
        if entry.tests and entry.text.startswith(UNTESTED)
    ]
    assert (empty, untested, said_why_and_tested) == ([], [], [])


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_relative_link_points_to_a_file_and_heading_that_exist() -> None:
    links = []
    for document in DOCUMENTS:
        text = re.sub(r"`[^`]*`", "", _prose(document.read_text()))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s) and other absolute addresses
            path, _, anchor = unquote(target).partition("#")
            linked = (document.parent / path).resolve() if path else document
            links.append(target)
            assert linked.exists(), f"{document.name}: {target}"
            if anchor:
                assert anchor in {_slug(h) for h in _headings(linked.read_text())}, (
                    f"{document.name}: {target}"
                )
    assert len(links) > 20


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    commands = re.findall(r"^(\./tapdeck\.sh test)\b", _read("README.md"), re.M)
    assert commands == ["./tapdeck.sh test"]
    assert re.search(r"^exec \./tapdeck\.sh test$", _read(".ci/run"), re.M)


def test_the_command_table_names_every_command_the_cli_has() -> None:
    from typer.main import get_command

    from tapdeck.app.cli import app

    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    for name, heading in (("README.md", "## Command line"), ("docs/cli.md", "# Command line")):
        table = _table(_section(_read(name), heading))
        documented = set(re.findall(r"^\| `tapdeck (\w+)", table, re.M))
        documented |= {"tui"} if "`tapdeck tui`" in table else set()
        assert documented == commands, name


def test_the_data_dir_listing_names_every_file_a_server_leaves_there(tmp_path: Path) -> None:
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig
    from tests.support.fake_vllm import models_only_engine

    listing = _read("docs/cli.md").split("Data lives in `--data-dir`", 1)[1].split("\n\n", 1)[0]
    data = tmp_path / "data"
    with models_only_engine() as engine, LocalServer(ServerConfig(port=0, data_dir=data, engine_url=engine)):
        # SQLite's own -wal and -shm files go with `capture.db (SQLite, WAL)`.
        made = {re.sub(r"-(wal|shm)$", "", p.name) for p in data.iterdir()}
    assert {"capture.db", "admin.key", "admin.key.lock"} <= made
    assert [name for name in sorted(made) if f"`{name}`" not in listing] == []


def test_the_agent_versions_are_the_pinned_ones() -> None:
    from tapdeck.runner.agent_install import PACKAGES

    table = dict(re.findall(r"^\| ([\w-]+) (\d+\.\d+\.\d+) \|", _read("docs/agents.md"), re.M))
    assert set(table) == set(PACKAGES)
    assert table == {name: p.version for name, p in PACKAGES.items()}


def test_the_training_environment_versions_are_the_pinned_ones() -> None:
    section = _section(_read("docs/training.md"), "## The training environment")
    claimed = dict(re.findall(r"\b(torch|trl|openenv|transformers|trackio)\s+(\d+\.\d+\.\d+)", section))
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "scripts" / "train-env.txt").read_text(), re.M))
    assert len(claimed) == 5 and all(pins[name] == version for name, version in claimed.items())


def test_every_admin_route_of_the_table_exists_on_the_server(tmp_path: Path) -> None:
    from tapdeck.proxy.http.server import create_app
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store
    from tapdeck.runner.api import create_runner_router

    service = CaptureService(
        Store(tmp_path / "capture.db"), default_engine=None, public_url="http://127.0.0.1:9"
    )
    app = create_app(
        service,
        admin_key="k",
        routers=[create_runner_router(service, data_dir=tmp_path, default_engine=None)],
    )
    served = {
        (method.upper(), re.sub(r"\{\w+\}", "{}", path))
        for path, ops in app.openapi()["paths"].items()
        for method in ops
    }
    table = _table(_section(_read("docs/api.md"), "## Admin routes"))
    claimed: set[tuple[str, str]] = set()
    for row in re.findall(r"^\| (`[A-Z]+ .*?) \|", table, re.M):
        method = prefix = ""
        for item in re.findall(r"`([^`]+)`", row.split(" | ")[0]):
            if " " in item:
                method, path = item.split(" ", 1)
            else:  # `/metrics?after=`: the previous route's parent with this last step
                path = prefix + item
            path = path.split("?", 1)[0]
            prefix = path.rsplit("/", 1)[0]
            for variant in _expand(path):
                claimed.add((method, re.sub(r"\{\w+\}", "{}", variant)))
    assert len(claimed) >= 20
    assert claimed <= served, sorted(claimed - served)


def _expand(path: str) -> list[str]:
    """`/runs[/{id}]` → both; `/{id}/cancel\\|resume` → each."""
    if m := re.search(r"\[([^\]]+)\]", path):
        return _expand(path[: m.start()] + path[m.end() :]) + _expand(
            path[: m.start()] + m[1] + path[m.end() :]
        )
    if "\\|" in path:
        head, _, tail = path.rpartition("/")
        return [f"{head}/{alt}" for alt in tail.split("\\|")]
    return [path]


def test_the_settings_defaults_are_the_codes() -> None:
    from tapdeck.app.screens.setup import DEFAULT_ALTERNATIVES
    from tapdeck.runner.engine.model import DEFAULT_N_CTX
    from tapdeck.runner.rollout import BUDGET_PER_TURN
    from tapdeck.runner.rollout_settings import (
        DEFAULT_HARD_LIMIT_S,
        DEFAULT_MAX_TURNS,
        EMBEDDED_DECODE_TOKENS_PER_S,
        EMBEDDED_PREFILL_TOKENS_PER_S,
        FALLBACK_CONTEXT_TOKENS,
        HARD_LIMIT_MARGIN_S,
        PREFILL_SAFETY,
    )
    from tapdeck.schema.rollout_health import DEFAULT_MIN_LOSS_MASK_FRACTION

    rollouts = _read("docs/rollouts.md")
    assert f"has a {DEFAULT_N_CTX:,}-token context" in rollouts
    assert (
        f"{DEFAULT_HARD_LIMIT_S:g} s for the whole rollout, sandbox start included, or the "
        f"agent timeout + {HARD_LIMIT_MARGIN_S:g} s where that is longer"
    ) in rollouts
    assert f"| `--max-turns` | {DEFAULT_MAX_TURNS} (" in rollouts
    assert f"{FALLBACK_CONTEXT_TOKENS:,} if it lists none" in rollouts
    assert f"call budget of {BUDGET_PER_TURN} × max_turns" in rollouts
    assert (
        f"prefill {'three' if PREFILL_SAFETY == 3 else PREFILL_SAFETY} times over at the "
        f"measured {EMBEDDED_PREFILL_TOKENS_PER_S:g} tokens/s"
    ) in " ".join(rollouts.split())
    assert f"at {EMBEDDED_DECODE_TOKENS_PER_S:g} tokens/s" in " ".join(rollouts.split())
    assert f"{DEFAULT_ALTERNATIVES} by default" in _read("docs/tui.md")
    assert f"`min_loss_mask_fraction` (0 to 1, default {DEFAULT_MIN_LOSS_MASK_FRACTION:g}," in rollouts
    assert f"`min_loss_mask_fraction`, default {DEFAULT_MIN_LOSS_MASK_FRACTION:g};" in _read(
        "docs/capture.md"
    )
    sample = ROOT / "runner" / "sample_dataset"
    timeouts = {
        tomllib.loads((t / "task.toml").read_text())["agent"]["timeout_sec"]
        for t in sample.iterdir()
        if (t / "task.toml").is_file()
    }
    assert timeouts == {180.0} and "(180 s on the sample tasks)" in rollouts


def test_the_per_harness_defaults_table_is_the_codes() -> None:
    """docs/rollouts.md's table of the embedded engine's defaults is `HARNESS_DEFAULTS`, row by
    row, in its order."""
    from tapdeck.runner.rollout_settings import harness_defaults

    rollouts = _read("docs/rollouts.md")
    section = rollouts[rollouts.index("### Defaults per harness on the embedded engine") :].splitlines()
    first = next(i for i, line in enumerate(section) if line.startswith("| "))
    table = itertools.takewhile(lambda line: line.startswith("|"), section[first:])
    rows = [line for line in table if line.startswith("| ")][1:]  # no header, no |---| line
    expected = []
    for h in harness_defaults():
        expected.append(
            f"| {h.harness} | {h.tool_profile or '-'} | {h.first_prompt_tokens:,} | "
            f"{h.on_cut_reply} | {h.output_tokens:,} | {h.agent_timeout_s:,.0f} s |"
        )
    assert rows == expected


def test_no_test_asserts_on_wall_clock_time() -> None:
    elapsed = re.compile(
        r"assert[^\n]*(time\.(monotonic|time|perf_counter)\(\)|elapsed|duration)"
        r"[^\n]*[<>]=?\s*\d"
    )
    offenders = [
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py") if elapsed.search(p.read_text())
    ]
    assert offenders == []


def test_the_connection_limits_are_serves_flags_with_the_codes_defaults() -> None:
    import typer

    from tapdeck.app.cli import app
    from tapdeck.proxy.config import (
        DEFAULT_ENGINE_UPDATE_WAIT_S,
        DEFAULT_MAX_BODY_BYTES,
        DEFAULT_MAX_REPLY_BYTES,
        ConnectionLimits,
    )

    limits = ConnectionLimits()
    documented = {
        "--max-header-bytes": f"{limits.max_header_bytes} ({limits.max_header_bytes // 1024} KiB)",
        "--max-headers": f"{limits.max_headers}",
        "--header-timeout": f"{limits.header_timeout_s:g} s",
        "--body-timeout": f"{limits.body_timeout_s:g} s",
        "--keep-alive-timeout": f"{limits.keep_alive_s:g} s",
        "--max-body-bytes": f"{DEFAULT_MAX_BODY_BYTES} ({DEFAULT_MAX_BODY_BYTES // 2**20} MiB)",
        "--max-reply-bytes": f"{DEFAULT_MAX_REPLY_BYTES} ({DEFAULT_MAX_REPLY_BYTES // 2**20} MiB)",
        "--engine-update-wait": f"{DEFAULT_ENGINE_UPDATE_WAIT_S:g} s",
    }
    table = _table(_section(_read("docs/api.md"), "## Connection limits"))
    rows = re.findall(r"^\| `(--[\w-]+)` \| ([^|]+?) \|", table, re.M)
    assert dict(rows) == documented
    serve = typer.main.get_command(app).commands["serve"]
    assert set(documented) <= {opt for param in serve.params for opt in param.opts}
