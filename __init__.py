"""tapdeck: an operator's terminal for agentic RL.

The repository keeps `app/`, `proxy/`, `runner/` and `themes/` at its top level; pyproject.toml maps
this folder to the import package `tapdeck`, so they install as `tapdeck.app`, `tapdeck.proxy`, ...
"""

__version__ = "0.1.0"
