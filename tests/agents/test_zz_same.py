import json, shutil
from pathlib import Path
import pytest
from tests.agents.test_agent_binaries import run_cli, scripted_agent_reply
from tests.dialects.conftest import CaptureServer, ScriptedUpstream, capture, scripted, upstream  # noqa

@pytest.mark.parametrize("name", ["codex", "claude-code", "gemini-cli", "qwen-code", "opencode"])
def test_same(capture, upstream, name):
    firsts = []
    for i in range(2):
        root = Path("/tmp/agents3/sameroot")
        shutil.rmtree(root, ignore_errors=True); root.mkdir(parents=True)
        upstream.requests.clear()
        upstream.answer = scripted_agent_reply(name)
        info = capture.open_session()
        run_cli(name, info, root, "Create a file hello.txt containing hi.")
        first = next(r for r in upstream.requests if r.get("tools"))
        firsts.append(first)
    Path(f"/tmp/agents3/same-{name}.json").write_text(json.dumps(firsts))
