"""What the router knows about one client turn as it moves through prefill and decode."""

from __future__ import annotations

from dataclasses import dataclass

from disagg_router.conversation import Lookup, TurnEntry, TurnStart
from disagg_router.openai_request import ClientRequest
from disagg_router.payloads import EngineBodies


@dataclass
class Turn:
    """State of one client request: its conversation key, the entry it took, and whether
    prefill consumed that entry (an unconsumed entry goes back to the store on failure)."""

    request: ClientRequest
    bodies: EngineBodies
    request_id: str
    started: float
    key: str | None = None
    start: TurnStart | None = None
    entry: TurnEntry | None = None
    entry_spent: bool = False
    lookup: Lookup = Lookup.NO_KEY
