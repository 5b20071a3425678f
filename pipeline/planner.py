"""The worker's next run: which waiting clips go together, in which warmed (batch, container) session.

Sans-I/O and numpy-free: the worker hands in what waits and a cost table, and gets one run back.

    Waiting       one queued clip: its length, whether it is a final, how long it has waited, its stream
    CostTable     seconds per call of every warmed (batch, container) shape: measured by `bench model`
                  (its JSON's `cost_tables`, read with `read_cost_tables`) or modelled (`modelled_table`)
    next_run      the run to make now (a PlannedRun), or None when nothing waits

The rules of next_run, in order:
  1. Only warmed shapes: the table's shapes are the engine's grid, and nothing else is ever chosen.
  2. A clip runs in the smallest container that holds it, with other clips of that container (a clip
     longer than every container goes to the largest, where the engine refuses it alone).
  3. Finals first: while a final waits, every run holds finals; partials and uploads' segments of the
     same container ride only in the rows the finals leave spare, which cost nothing more.
  4. A stream's clips run in the order given: a clip is not taken while an earlier one of its stream is
     left behind (a final's words are the next final's context, pipeline/trim.py; a partial must not
     overtake its stream's final).
  5. Per container, its takeable clips (up to its largest batch) are covered by the batch sizes of the
     least total table seconds (ties: fewer calls), and the largest batch of that cover runs now; of the
     containers, the one whose cover costs the least per clip. This is where "a small batch now or a
     fuller, dearer one" is decided, from measured times rather than constants (5 clips: one batch of 16
     when it costs less than 4 + 1). Ties: more clips, then the oldest clip's container, then the smaller.
  6. Never starving: once the lane's first clip (the oldest final, else the first of the others) has
     waited `patience` seconds, only runs of its container that take it are considered.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Iterable, Mapping, Sequence

from .audio import SAMPLE_RATE

Shape = tuple[int, int]  # (batch rows, container samples)

COST_TABLE_FORMAT = "unipad-cost-table/1"
# A GPU call of a short container is not much cheaper than a long one (launches, not arithmetic), so a
# modest wait lets the cheaper runs go first, then the oldest clip's container is served whatever it costs.
# H100 calls take 5-30 ms (docs/benchmarks.md): a final waits at most a few calls past this.
DEFAULT_PATIENCE = 0.1


@dataclass(frozen=True, slots=True)
class Waiting:
    """One queued clip: `samples` long, a final or not (`urgent`), queued `waited` seconds ago, of `stream`."""

    samples: int
    urgent: bool
    waited: float
    stream: str


@dataclass(frozen=True)
class PlannedRun:
    """One session call: `clips` (indices into the waiting list, finals first, each in list order) in a
    batch of `batch` rows of `container` samples, which the table says takes `seconds`."""

    batch: int
    container: int
    clips: tuple[int, ...]
    seconds: float


@dataclass(frozen=True)
class PlannerOptions:
    patience: float = DEFAULT_PATIENCE  # seconds the lane's first clip may wait before its container goes next

    def __post_init__(self) -> None:
        if not self.patience >= 0:
            raise ValueError(f"patience must be >= 0 s, got {self.patience}")


@dataclass(frozen=True)
class CostTable:
    """Seconds per call of each (batch, container samples) shape; every container has batch 1."""

    seconds: Mapping[Shape, float]
    source: str = "modelled"
    containers: tuple[int, ...] = field(init=False)  # ascending
    batches: Mapping[int, tuple[int, ...]] = field(init=False)  # container -> its batch sizes, ascending
    # container -> per clip count m (0 .. its largest batch): (seconds, calls, largest batch) of the cheapest
    # cover of m clips by its batch sizes
    covers: Mapping[int, tuple[tuple[float, int, int], ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("a cost table needs at least one shape")
        for (batch, container), s in self.seconds.items():
            if batch < 1 or container < 1 or not (math.isfinite(s) and s > 0):
                raise ValueError(f"bad cost table entry: batch {batch}, container {container}, {s} s")
        containers = tuple(sorted({c for _, c in self.seconds}))
        batches = {c: tuple(sorted(b for b, k in self.seconds if k == c)) for c in containers}
        missing = [c for c in containers if batches[c][0] != 1]
        if missing:
            raise ValueError(f"containers {missing} have no batch 1 (a lone clip must always have a shape)")
        object.__setattr__(self, "containers", containers)
        object.__setattr__(self, "batches", batches)
        object.__setattr__(self, "covers", {c: self._covers(c) for c in containers})

    def _covers(self, container: int) -> tuple[tuple[float, int, int], ...]:
        """Dynamic programming over the clip count, as pipeline/batching.py's split but with table seconds."""
        sizes = self.batches[container]
        best = [(0.0, 0, 0)]
        for m in range(1, sizes[-1] + 1):
            best.append(min((best[max(0, m - b)][0] + self.seconds[(b, container)], best[max(0, m - b)][1] + 1,
                             -max(b, -best[max(0, m - b)][2])) for b in sizes))
        return tuple((cost, calls, -neg) for cost, calls, neg in best)

    def container_for(self, samples: int) -> int:
        """The smallest container that holds `samples`; the largest when none does (rule 2)."""
        for c in self.containers:
            if samples <= c:
                return c
        return self.containers[-1]


def modelled_table(grid: Iterable[Shape], overhead_rows: float) -> CostTable:
    """The table without a measurement: a call costs (batch + overhead_rows) x container seconds, in
    row-seconds (only ratios matter to next_run). Arithmetic grows with rows x samples; `overhead_rows`
    stands for each call's fixed cost (pipeline/batching.py CALL_OVERHEAD_ROWS: the one figure the engine's
    own batch split uses too)."""
    return CostTable({(b, c): (b + overhead_rows) * c / SAMPLE_RATE for b, c in grid},
                     f"modelled: (batch + {overhead_rows:g}) x container seconds")


def measured_table(grid: Iterable[Shape], measured: Mapping[Shape, float], overhead_rows: float,
                   source: str) -> CostTable:
    """The table for the engine's `grid` from `measured` seconds: shapes measured keep their time; the
    others get the modelled cost scaled by the median measured/modelled ratio; measured shapes outside
    the grid are dropped (they are not warmed). With no measured shape in the grid: the modelled table."""
    model = modelled_table(grid, overhead_rows).seconds
    ratios = [measured[shape] / cost for shape, cost in model.items() if shape in measured]
    if not ratios:
        return CostTable(model, f"modelled (no shape of {source} is in the grid)")
    scale = median(ratios)
    guessed = len(model) - len(ratios)
    return CostTable({shape: measured.get(shape, cost * scale) for shape, cost in model.items()},
                     f"{source}, {len(ratios)} shapes measured" + (f", {guessed} scaled from the model" if guessed else ""))


def next_run(waiting: Sequence[Waiting], table: CostTable, options: PlannerOptions = PlannerOptions()) -> PlannedRun | None:
    """The run to make now (see the module docstring for the rules), or None when nothing waits.

    `waiting` is in priority order within each kind: finals in arrival order, the others in the order
    they take turns; finals are served first wherever they stand in the list."""
    if not waiting:
        return None
    order = [i for i, w in enumerate(waiting) if w.urgent] + [i for i, w in enumerate(waiting) if not w.urgent]
    lane_urgent = waiting[order[0]].urgent
    # Rule 4 in one pass: a stream is bound to the container of its first clip; a clip of another container
    # is left behind, and so is every later clip of that stream.
    bound: dict[str, int | None] = {}
    takeable: dict[int, list[int]] = {}  # container -> clips it may take, in order
    for i in order:
        w = waiting[i]
        c = table.container_for(w.samples)
        if bound.setdefault(w.stream, c) == c:
            takeable.setdefault(c, []).append(i)
        else:
            bound[w.stream] = None
    head = order[0]
    head_container = table.container_for(waiting[head].samples)
    overdue = waiting[head].waited >= options.patience
    best: tuple | None = None
    for c, clips in takeable.items():
        if waiting[clips[0]].urgent != lane_urgent or (overdue and c != head_container):
            continue  # rule 3: the finals' lane holds a final; rule 6: the overdue head's container only
        m = min(len(clips), table.batches[c][-1])
        cost, _, b = table.covers[c][m]
        n = min(b, m)
        key = (cost / m, -n, c != head_container, c)
        if best is None or key < best[0]:
            best = (key, PlannedRun(b, c, tuple(clips[:n]), table.seconds[(b, c)]))
    assert best is not None  # the head is always takeable in its own container
    return best[1]


# ---- the table's file format (bench model writes it, the server reads it) ---------------------------

def cost_table_document(seconds: Mapping[Shape, float], precision: str, device: str, provider: str,
                        model: str, extra: Mapping[Shape, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """One precision's measured table as JSON-ready data: containers in seconds, `extra` figures per shape
    (memory) kept beside the time."""
    calls = [{"batch": b, "container": c / SAMPLE_RATE, "seconds": s, **dict((extra or {}).get((b, c), {}))}
             for (b, c), s in sorted(seconds.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    return {"format": COST_TABLE_FORMAT, "precision": precision, "device": device, "provider": provider,
            "model": model, "calls": calls}


@dataclass(frozen=True)
class MeasuredCosts:
    """One precision's table as read from a file."""

    precision: str
    device: str
    seconds: Mapping[Shape, float]
    model: str = ""


def read_cost_tables(data: Any) -> dict[str, MeasuredCosts]:
    """precision -> its table, from a `bench model --save` result (its `cost_tables`) or one table document;
    ValueError when neither."""
    docs = data.get("cost_tables") if isinstance(data, dict) and "cost_tables" in data else {"": data}
    if not isinstance(docs, dict) or not docs:
        raise ValueError("no cost table in it (expected `bench model --save` output with `cost_tables`)")
    tables = {}
    for doc in docs.values():
        if not isinstance(doc, dict) or doc.get("format") != COST_TABLE_FORMAT:
            raise ValueError(f"not a {COST_TABLE_FORMAT} table (write one with `python -m bench model --save`)")
        try:
            seconds = {(int(e["batch"]), int(round(float(e["container"]) * SAMPLE_RATE))): float(e["seconds"])
                       for e in doc["calls"]}
            CostTable(seconds)  # the same checks as when the server builds its table
            tables[str(doc["precision"])] = MeasuredCosts(str(doc["precision"]), str(doc["device"]), seconds,
                                                          str(doc.get("model", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a damaged cost table ({type(exc).__name__}: {exc})") from None
    return tables
