"""Replay: score a captured rollout's sampled tokens under a reference engine, token by token, and
measure the drift between the engine that sampled it and the reference (`tapdeck replay`,
`POST /admin/sessions/{id}/replay`).

`chains` groups a session's turns into token chains (one request each), `reference` asks an engine
for prompt logprobs the way vLLM serves them, `drift` turns the paired logprobs into the figures RL
libraries log, and `session` ties them together and stores the result beside the capture.
"""
