"""Where a step's time goes, from Horovod's timeline: collectives, negotiations, and compute.

The share with a collective (allreduce) in flight, the share with only a negotiation open (from a tensor's
submission until every rank has submitted it; it overlaps the backward pass and includes Horovod's
coordination cycle), and the rest, compute only.

`app benchmark --timeline` records Horovod's timeline (HOROVOD_TIMELINE=DYNAMIC, then hvd.start_timeline /
stop_timeline around a few measured steps) into a Chrome trace file that Perfetto (ui.perfetto.dev) and
chrome://tracing open. This module reads it back: pure Python, no TensorFlow, so `app report` can use it.

Horovod writes one "process" per tensor and, per tensor, a stack of begin/end events: a top-level
NEGOTIATE_<OP> (rank 0 waits for every rank), then a top-level <OP> (ALLREDUCE, ...) with its parts inside
(MEMCPY_IN_FUSION_BUFFER, NCCL_ALLREDUCE or GLOO_ALLREDUCE, ...). Tensors overlap in time (fusion), so the
shares are unions of intervals across tensors, not sums.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.core.errors import UsageError, read_regular

READ_LIMIT = 256 * 2**20  # bytes: a few steps of ResNet-50 are a few MB


def load_events(path: Path) -> list[dict]:
    """The trace's events, up to the last complete one.

    A file Horovod did not close (the run was killed) lacks its final bracket: it is read up to the last
    complete event.

    Raises:
        UsageError: one line naming the file when it is not a trace.
    """
    text = read_regular(path, str(path), READ_LIMIT, "Horovod timeline").decode("utf-8", "replace").strip()
    for attempt in (text, text.rstrip(",") + "]", text[: text.rfind("}") + 1] + "]"):
        try:
            events = json.loads(attempt)
        except (ValueError, RecursionError):
            continue
        if isinstance(events, list):
            return [e for e in events if isinstance(e, dict)]
    raise UsageError(f"{path}: not a Horovod timeline (a JSON list of trace events)")


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def intervals(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Top-level activities per kind ("negotiation", "collective"), as (start, end) in microseconds.

    Nested parts are inside their collective and not counted twice. An activity left open (the trace ended)
    is dropped.
    """
    stacks: dict[object, list[tuple[str, float]]] = {}
    found: dict[str, list[tuple[float, float]]] = {"negotiation": [], "collective": []}
    for e in events:
        ph, ts = e.get("ph"), e.get("ts")
        if ph not in ("B", "E") or not isinstance(ts, int | float) or isinstance(ts, bool):
            continue
        stack = stacks.setdefault(e.get("pid"), [])
        if ph == "B":
            stack.append((str(e.get("name", "")), float(ts)))
        elif stack:
            name, start = stack.pop()
            if not stack and ts >= start:
                kind = "negotiation" if name.startswith("NEGOTIATE") else "collective"
                found[kind].append((start, float(ts)))
    return found


def shares(path: Path, window_s: float) -> dict:
    """The seconds and fractions of ``window_s`` with a collective in flight or a negotiation under way.

    ``window_s`` is the wall time of the recorded steps; negotiations count outside collectives only; the rest
    is compute (and input).
    """
    events = load_events(path)
    found = intervals(events)
    collective = _union(found["collective"]) / 1e6
    busy = _union(found["collective"] + found["negotiation"]) / 1e6
    negotiation = busy - collective
    window = max(window_s, busy, 1e-9)
    return {
        "window_s": window,
        "collective_s": collective,
        "negotiation_s": negotiation,
        "collective_fraction": collective / window,
        "negotiation_fraction": negotiation / window,
        "compute_fraction": max(0.0, 1 - busy / window),
        "collectives": len(found["collective"]),
    }
