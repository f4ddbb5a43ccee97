"""The bound on generation requests in flight, so that slow or many clients cannot take every
buffer and task of the router (``--max-concurrent-requests``; the body deadline is
``openai_request.read_body``'s)."""

from __future__ import annotations


class RequestSlots:
    """At most ``limit`` requests hold a slot at once; ``in_flight`` is how many do."""

    __slots__ = ("in_flight", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def take(self) -> bool:
        """Take a slot; False (none taken) when all are held."""
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def give_back(self) -> None:
        """Give back a slot taken."""
        self.in_flight -= 1
