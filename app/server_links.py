"""The tapdeck servers one TUI is attached to: each one's client, session board and connection,
the table keys that keep their rows apart, and the status line that says which ones answer.
Free of Textual.

With one server nothing here shows: its rows are keyed by their own ids and the status line is the
App's as ever. With several, a row's key is `NAME/ID` (a session or run id may be the same on two
servers: each server makes its own) and the tables gain a server column.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from heapq import merge

from tapdeck.app.client import TapdeckClient
from tapdeck.app.views.row_view import RowFacts, board_facts
from tapdeck.app.views.sessions import Cell, SessionBoard
from tapdeck.app.views.text import clip
from tapdeck.schema.sessions import EngineWait

SEVERAL_HELP = (
    "Attached to several servers: Sessions and Runs show every server's rows, its name in the "
    "server column (server:NAME in the filter keeps one server's); each action goes to its row's "
    "server. A server that stopped answering keeps its rows, greyed, until it answers again. "
    "Setup, Info and Train work on one server: pick it with 'Work on server' in the command palette."
)
"""What F1 says first with several servers."""
KEY_SEP = "/"
"""Between a server's name and a row's id in a table key; no server name holds it."""
SERVER_W = 10
"""Cells of the server column (a longer name is cut, with an ellipsis)."""


@dataclass(eq=False)
class ServerLink:
    """One attached server. `name`: the server column's word (a context's name, or HOST:PORT);
    `label`: the status line's (its URL; "embedded URL" for the TUI's own server)."""

    name: str
    label: str
    client: TapdeckClient
    board: SessionBoard = field(default_factory=SessionBoard)
    connected: bool = False
    lost: str = ""
    """Why it stopped answering, and when it is tried again; "" while it answers (or before the
    first try). Its rows stay on screen, greyed, until it answers again."""
    engine_wait: EngineWait | None = None
    """What its `/health` last said of the engine it waits for (None: none)."""


def host_port(base_url: str) -> str:
    """A server's short name when it has no context name: `HOST:PORT` of its URL."""
    return base_url.split("://", 1)[-1].split("/", 1)[0]


class ServerLinks:
    """The attached servers in the order given; the first is the one Setup, Info and Train work
    on until the operator picks another (`target`)."""

    def __init__(self, links: Sequence[ServerLink]) -> None:
        if not links:
            raise ValueError("a TUI needs a server")
        names = [link.name for link in links]
        if bad := next((n for n in names if not n or KEY_SEP in n), None):
            raise ValueError(f"server name {bad!r} is empty or holds {KEY_SEP!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"two servers share a name: {', '.join(names)}")
        self.all = list(links)
        self.target = self.all[0]
        """The server Setup, Info and Train work on."""
        self._rows: dict[str, tuple[tuple[Cell, ...], bool, tuple[Cell, ...]]] = {}
        """Each Sessions row last made, by key: the board's cells it was made of, whether they
        were greyed, and the row (the same object while those are: the table skips it)."""

    def __iter__(self) -> Iterator[ServerLink]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    @property
    def several(self) -> bool:
        """More than one server: the tables show a server column and keys carry the server."""
        return len(self.all) > 1

    @property
    def first(self) -> ServerLink:
        return self.all[0]

    def named(self, name: str) -> ServerLink | None:
        return next((link for link in self.all if link.name == name), None)

    def key(self, link: ServerLink, item_id: str) -> str:
        """The table key of `item_id` (a session, rollout or run id) on `link`."""
        return f"{link.name}{KEY_SEP}{item_id}" if self.several else item_id

    def find(self, key: str | None) -> tuple[ServerLink, str] | None:
        """The server and id a table key names; None for None or a server no longer attached."""
        if key is None:
            return None
        if not self.several:
            return self.first, key
        name, _, item_id = key.partition(KEY_SEP)
        link = self.named(name)
        return (link, item_id) if link is not None else None

    # -- the Sessions table ----------------------------------------------------------------------
    def session_rows(self, now: float) -> dict[str, tuple[Cell, ...]]:
        """Every server's rows (`SessionBoard.rows`, then the server cell), server by server in
        the order given; a server that stopped answering has its rows greyed."""
        made: dict[str, tuple[tuple[Cell, ...], bool, tuple[Cell, ...]]] = {}
        for link in self.all:
            lost = bool(link.lost)
            for item_id, cells in link.board.rows(now).items():
                key = self.key(link, item_id)
                last = self._rows.get(key)
                if last is None or last[0] is not cells or last[1] != lost:
                    row = (*cells, (clip(link.name, SERVER_W), ""))
                    last = (cells, lost, greyed(row) if lost else row)
                made[key] = last
        self._rows = made
        return {key: row for key, (_, _, row) in made.items()}

    def session_facts(self, now: float) -> dict[str, RowFacts]:
        """What the filter and sort read of each row of `session_rows`, by the same keys."""
        return {
            key: facts
            for link in self.all
            for key, facts in board_facts(
                link.board, now, server=link.name, prefix=self.key(link, "")
            ).items()
        }

    def states(self) -> list[str]:
        """The state of every row of every server (the summary line)."""
        return [state for link in self.all for state in link.board.states()]

    def call_times(self) -> Iterable[float]:
        """When each server's captured calls reached this TUI, oldest first (the board's calls/s)."""
        if not self.several:
            return self.first.board.call_times
        return merge(*(link.board.call_times for link in self.all))

    def status(self) -> tuple[str, str]:
        """(line, level) of the status line with several servers: the ones that stopped answering
        first (why, and when they are tried again), then any waiting for its engine, then the ones
        that answer."""
        parts = [f"{link.name} unreachable: {link.lost}" for link in self.all if link.lost]
        parts += [
            f"{link.name}: {link.engine_wait.line()}"
            for link in self.all
            if link.connected and link.engine_wait is not None
        ]
        up = [link.name for link in self.all if link.connected]
        connecting = [link.name for link in self.all if not link.connected and not link.lost]
        if up:
            parts.append(f"connected to {', '.join(up)}")
        if connecting:
            parts.append(f"connecting to {', '.join(connecting)}…")
        level = (
            "error"
            if any(link.lost for link in self.all)
            else "warning"
            if any(link.connected and link.engine_wait for link in self.all)
            else "info"
        )
        return " · ".join(parts), level


def greyed(row: Iterable[Cell]) -> tuple[Cell, ...]:
    """`row` with every cell dimmed: what its server last said, kept while it does not answer."""
    return tuple((text, "muted") for text, _ in row)
