"""The agents' recorded request shapes (tests/proxy/dialects/recordings) and the calls that replay them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from google import genai
from google.genai import types

RECORDINGS = Path(__file__).resolve().parents[1] / "proxy" / "dialects" / "recordings"


def recording(name: str) -> dict[str, Any]:
    """One agent's recording (see recordings/README.md)."""
    return json.loads((RECORDINGS / f"{name}.json").read_text())


def google_client(info: dict[str, Any]) -> genai.Client:
    """google-genai (the SDK gemini-cli bundles, in its Python form) on a session's base URL."""
    return genai.Client(
        api_key=info["api_key"], http_options=types.HttpOptions(base_url=info["base_urls"]["google"])
    )


def gemini_router(info: dict[str, Any]) -> types.GenerateContentResponse:
    """gemini-cli's model-router call: non-streaming, JSON mode with a `responseJsonSchema`."""
    body = recording("gemini_cli")["router"]["body"]
    config = types.GenerateContentConfig.model_validate(
        {**body["generationConfig"], "systemInstruction": body["systemInstruction"]}
    )
    client = google_client(info)  # held: a collected Client closes its connection pool
    return client.models.generate_content(
        model="gemini-3.5-flash-lite",
        contents=[types.Content.model_validate(c) for c in body["contents"]],
        config=config,
    )
