"""What the screens show, computed from the server's replies — free of Textual so it is testable alone.

Each function takes the `tapdeck.schema` models the client validated the replies into and returns
plain values; the widgets only style them. Values the server left empty show as "–". One module
per thing shown: the session table (`sessions`), the rollout graph (`graph`), a turn's tokens
(`tokens`), runs and their groups (`runs`), an error as a line (`errors`); `text` holds the
formatting they share.
"""
