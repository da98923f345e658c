"""The embedded engine: a small real model served in vLLM's wire format."""
