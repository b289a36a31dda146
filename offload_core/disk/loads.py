"""What the disk tier's sources ask of the engine's transfers, defined here, below them.

``FileSource`` and ``MappedSource`` implement runtime/source.py's ``WeightSource``, whose
``load`` is handed transfer/copies.py's ``Transfers`` and a slot of its ring. The disk tier
sits below the transfers in the import order (they run its reads), so its sources name only
the two verbs they call; ``Transfers`` has both, and the slot is passed through untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from .plan import ReadPlan


class Loads(Protocol):
    def read_file(self, plan: ReadPlan, slot: Any) -> Future[Any]:
        """A group's bytes from a file into ``slot``; the future of its ready-event."""
        ...

    def run_read(self, nbytes: int, read: Callable[[], None]) -> Future[Any]:
        """Work on the load thread that needs no slot (faulting a mapping's pages in)."""
        ...
