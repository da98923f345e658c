"""The engine side: its address, the HTTP client, capture tiers, the request sent upstream, and
what the engine's chat route would do (token-in, JSON mode, reasoning markers, tool-call parsers).
"""
