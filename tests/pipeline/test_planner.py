"""The run planner (pipeline/planner.py) on cost tables: containers, batches, finals first, stream order, patience,
and the table's file format. Pure: no engine, no model."""
from __future__ import annotations

import json

import pytest

from pipeline.audio import SAMPLE_RATE
from pipeline.planner import (CostTable, PlannerOptions, Waiting, cost_table_document, measured_table, modelled_table,
                              next_run, read_cost_tables)

S = SAMPLE_RATE
C2, C4, C30 = 2 * S, 4 * S, 30 * S
# An H100-like table: a call costs little more with more rows, and a short container is cheaper but not in
# proportion (launches dominate); seconds per call.
GPU = CostTable({(1, C2): 0.004, (4, C2): 0.005, (16, C2): 0.008,
                 (1, C4): 0.005, (4, C4): 0.006, (16, C4): 0.011,
                 (1, C30): 0.026, (4, C30): 0.045, (16, C30): 0.117})


def final(seconds: float, stream: str, waited: float = 0.0) -> Waiting:
    return Waiting(int(seconds * S), True, waited, stream)


def partial(seconds: float, stream: str, waited: float = 0.0) -> Waiting:
    return Waiting(int(seconds * S), False, waited, stream)


def test_nothing_waiting_plans_nothing():
    assert next_run([], GPU) is None


def test_clips_of_one_container_share_a_run_in_the_smallest_container_that_holds_them():
    waiting = [final(1.5, "a"), final(3.0, "b"), final(1.0, "c"), final(2.0, "d")]  # 2, 4, 2, 2 s containers
    run = next_run(waiting, GPU)
    assert (run.batch, run.container, run.clips) == (4, C2, (0, 2, 3)) and run.seconds == 0.005
    assert next_run([waiting[1]], GPU).container == C4


def test_the_table_chooses_a_fuller_batch_or_a_smaller_one():
    five = [final(1.0, f"s{i}") for i in range(5)]
    assert next_run(five, GPU).batch == 16  # 8 ms for 5 clips beats 4 + 1 (9 ms)
    proportional = CostTable({(1, C2): 0.01, (4, C2): 0.04, (16, C2): 0.16})  # no per-call cost (a CPU)
    run = next_run(five, proportional)
    assert (run.batch, len(run.clips)) == (4, 4)  # spare rows are pure loss: 4 now, 1 next


def test_finals_come_first_and_partials_ride_in_their_spare_rows():
    waiting = [partial(1.0, "p1"), partial(1.0, "p2"), final(20.0, "f"), partial(25.0, "p3")]
    run = next_run(waiting, GPU)
    assert run.container == C30 and run.clips == (2, 3) and run.batch == 4  # the final, then a partial of 30 s
    assert next_run([waiting[0], waiting[1]], GPU).clips == (0, 1)  # no final: the partials batch together


def test_the_cheapest_run_first_until_the_oldest_clip_has_waited_its_patience():
    waiting = [final(20.0, "old", waited=0.05), final(1.0, "a"), final(1.0, "b")]
    assert next_run(waiting, GPU).container == C2  # 2.5 ms a final against 26 ms
    waiting[0] = final(20.0, "old", waited=0.1)
    run = next_run(waiting, GPU)
    assert (run.container, run.clips, run.batch) == (C30, (0,), 1)
    assert next_run(waiting, GPU, PlannerOptions(patience=1.0)).container == C2


def test_a_streams_clips_run_in_their_order():
    # b's first final is in 30 s: its second (2 s) and its partial must not overtake it
    waiting = [final(20.0, "b", waited=0.01), final(1.0, "a"), final(1.0, "b"), partial(1.0, "b"), partial(1.0, "c")]
    run = next_run(waiting, GPU)
    assert run.container == C2 and run.clips == (1, 4)
    # two finals of one stream in one container go together, in order
    assert next_run([final(1.0, "x"), final(1.5, "x")], GPU).clips == (0, 1)


def test_only_the_tables_shapes_are_planned_and_a_clip_too_long_goes_to_the_largest():
    one = CostTable({(1, C4): 1.0, (2, C4): 1.5})
    assert next_run([final(1.0, "a"), final(1.0, "b"), final(1.0, "c")], one).batch == 2
    run = next_run([final(40.0, "a")], one)  # longer than every container: the engine refuses it, alone
    assert (run.batch, run.container) == (1, C4)


def test_a_table_needs_batch_1_in_every_container_and_positive_times():
    with pytest.raises(ValueError, match="no batch 1"):
        CostTable({(1, C2): 1.0, (4, C4): 1.0})
    with pytest.raises(ValueError, match="bad cost table entry"):
        CostTable({(1, C2): 0.0})
    with pytest.raises(ValueError):
        PlannerOptions(patience=-1)


def test_the_modelled_table_is_rows_times_container_plus_the_call_overhead():
    table = modelled_table([(1, C2), (4, C2), (1, C30)], overhead_rows=3.0)
    assert table.seconds == {(1, C2): 8.0, (4, C2): 14.0, (1, C30): 120.0}
    assert "modelled" in table.source


def test_a_measured_table_fills_unmeasured_shapes_from_the_model_and_drops_unwarmed_ones():
    grid = [(1, C2), (4, C2), (1, C4), (4, C4)]
    measured = {(1, C2): 0.008, (4, C2): 0.014, (16, C2): 0.5}  # twice the model (overhead 3), and 16 is not warmed
    table = measured_table(grid, measured, 3.0, "bench")
    assert set(table.seconds) == set(grid)
    assert table.seconds[(1, C2)] == 0.008 and table.seconds[(4, C4)] == pytest.approx(0.028)
    assert "2 shapes measured, 2 scaled" in table.source
    assert "modelled" in measured_table(grid, {(1, C30): 1.0}, 3.0, "bench").source


def test_cost_tables_go_through_the_bench_json_and_back():
    doc = cost_table_document(GPU.seconds, "fp16", "cuda", "CUDAExecutionProvider", "sv",
                              extra={(1, C2): {"device_mib": 12.5}})
    assert doc["calls"][0] == {"batch": 1, "container": 2.0, "seconds": 0.004, "device_mib": 12.5}
    tables = read_cost_tables(json.loads(json.dumps({"command": "model", "cost_tables": {"fp16": doc}})))
    assert tables["fp16"].seconds == dict(GPU.seconds) and tables["fp16"].device == "cuda"
    assert read_cost_tables(doc)["fp16"].model == "sv"  # one table alone reads too
    with pytest.raises(ValueError, match="unipad-cost-table"):
        read_cost_tables({"command": "model"})
    with pytest.raises(ValueError, match="damaged"):
        read_cost_tables({**doc, "calls": [{"batch": 4, "container": 2.0, "seconds": 0.1}]})
