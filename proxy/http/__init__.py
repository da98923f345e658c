"""The proxy's HTTP face: the app and its routes, errors rendered per caller, limits, SSE, the
access log, the event bus, and the thread uvicorn serves it from.
"""
