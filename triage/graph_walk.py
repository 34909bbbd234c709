"""One walk over autograd graphs, shared by everything in triage that reads one (the health monitor, the probes)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any


def autograd_nodes(roots: Iterable[Any], limit: int, *, breadth_first: bool = False) -> Iterator[Any]:
    """Each node of the autograd graphs under `roots` once (depth first, or breadth first), at most `limit` of them.

    The walk holds every node it has yielded: torch (2.11 did) can hand out a new Python object for a node at each
    access, so the id() of a node that was dropped can come back as the next node's, and a walk that kept only ids
    stopped there (every parameter then read as never reached by a gradient).
    """
    seen: dict[int, Any] = {}
    pending = deque(roots)
    take = pending.popleft if breadth_first else pending.pop
    while pending and len(seen) < limit:
        node = take()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        yield node
        pending.extend(child for child, _ in getattr(node, "next_functions", ()) if child is not None)
