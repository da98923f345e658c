"""Makes `proxy_core_fixtures` (Turns built from recorded vLLM bodies) importable by these tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
