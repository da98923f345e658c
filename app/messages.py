"""Messages the TUI passes between its event worker, the App and the screens.

The high-rate ones coalesce in the queue (`can_replace`), so a burst of server events becomes one
refresh instead of one per event.
"""

from __future__ import annotations

from textual.message import Message


class SessionsChanged(Message):
    """The session board changed (one or many events)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SessionsChanged)


class TurnCaptured(Message):
    """A new turn reached a session's rollout graph (`server`: the name of the server it is on)."""

    def __init__(self, session_id: str, server: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.server = server

    def can_replace(self, message: Message) -> bool:
        return (
            isinstance(message, TurnCaptured)
            and message.session_id == self.session_id
            and message.server == self.server
        )


class RunsChanged(Message):
    """A run started, progressed or finished."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsChanged)


class ConnectionChanged(Message):
    """A server's event stream connected or was lost (`error` says why and what to do; `server`:
    the name of that server)."""

    def __init__(self, server: str, connected: bool, error: str = "", *, gave_up: bool = False) -> None:
        super().__init__()
        self.server = server
        self.connected = connected
        self.error = error
        self.gave_up = gave_up
        """The TUI stopped trying to reconnect (the server refused its admin key)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ConnectionChanged) and message.server == self.server
