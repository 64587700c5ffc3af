"""The one pass-ordering sort: a stable topological sort of passes under ordering edges.

``Pipeline`` orders its passes with it (the earliest ready pass first); the torch-compatible
``PassManager`` in :mod:`fxpass.compat` uses it with torch's first-in-first-out queue, so its
order and its cycle message stay torch's.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

__all__ = ["topological_order"]


def topological_order(
    succ: Sequence[Sequence[int]], *, fifo: bool = False
) -> tuple[list[int], list[int]]:
    """Order ``range(len(succ))`` so that ``i`` comes before every ``j`` in ``succ[i]``.

    Returns ``(order, indegree)``: ``order`` holds every index whose predecessors all came
    before it; the indices left out (on or behind a cycle) keep a nonzero ``indegree``. Of
    the ready indices the smallest goes first, or, with ``fifo``, the one ready first
    (ties in index order). An edge listed twice counts twice.
    """
    n = len(succ)
    indegree = [0] * n
    for targets in succ:
        for j in targets:
            indegree[j] += 1
    ready = [i for i in range(n) if indegree[i] == 0]
    queue: deque[int] = deque(ready)
    order: list[int] = []
    while queue if fifo else ready:
        i = queue.popleft() if fifo else heapq.heappop(ready)
        order.append(i)
        for j in sorted(succ[i]):
            indegree[j] -= 1
            if indegree[j] == 0:
                if fifo:
                    queue.append(j)
                else:
                    heapq.heappush(ready, j)
    return order, indegree
