from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.audio import SAMPLE_RATE, encoder_frames, seconds_to_samples
from pipeline.engine_options import EngineOptions, shape_plan
from pipeline.families import PARAFORMER, SENSEVOICE
from pipeline.shapes import (DEFAULT_CPU_CONTAINERS, DEFAULT_GPU_CONTAINERS, OPEN_STEP, ShapePolicy, open_token_container,
                             parse_containers, token_containers)


def test_defaults_are_valid_and_end_at_the_segment_cap():
    assert ShapePolicy(DEFAULT_GPU_CONTAINERS).sizes == (seconds_to_samples(30),)
    cpu = ShapePolicy(DEFAULT_CPU_CONTAINERS)
    assert cpu.largest == ShapePolicy(DEFAULT_GPU_CONTAINERS).largest  # every policy holds a 30 s segment


def test_container_for_picks_the_smallest_that_holds_the_clip():
    policy = ShapePolicy((4, 8, 15, 30))
    assert policy.container_for(0) == 4 * SAMPLE_RATE
    assert policy.container_for(4 * SAMPLE_RATE) == 4 * SAMPLE_RATE
    assert policy.container_for(4 * SAMPLE_RATE + 1) == 8 * SAMPLE_RATE
    assert policy.container_for(30 * SAMPLE_RATE) == 30 * SAMPLE_RATE
    with pytest.raises(ValueError, match="longer than the largest container"):
        policy.container_for(30 * SAMPLE_RATE + 1)


@given(st.integers(min_value=0, max_value=30 * SAMPLE_RATE))
def test_container_for_is_minimal(n):
    policy = ShapePolicy(DEFAULT_CPU_CONTAINERS)
    size = policy.container_for(n)
    assert size >= n
    assert all(s < n for s in policy.sizes if s < size)


@pytest.mark.parametrize("bad", [(), (0,), (-1, 4), (8, 4), (4, 4), (4.00001,), (1000,)])
def test_invalid_policies_are_refused(bad):
    with pytest.raises(ValueError):
        ShapePolicy(bad)


def test_fractional_seconds_that_are_whole_samples_are_fine():
    assert ShapePolicy((0.5, 2.25)).sizes == (SAMPLE_RATE // 2, SAMPLE_RATE * 9 // 4)


def test_parse_containers():
    assert parse_containers("4,8,15,30") == (4.0, 8.0, 15.0, 30.0)
    assert parse_containers(" 30 , 4 ") == (4.0, 30.0)  # sorted for the user
    for bad in ("", "4,,x", "4,4", "0"):
        with pytest.raises(ValueError):
            parse_containers(bad)


@given(st.integers(min_value=0, max_value=seconds_to_samples(30.0)))
def test_an_open_policy_rounds_up_to_whole_encoder_frames(n):
    policy = ShapePolicy((30.0,), step=OPEN_STEP)
    size = policy.container_for(n)
    assert size % OPEN_STEP == 0 and n <= size < max(n, 1) + OPEN_STEP and size <= policy.largest


def test_an_open_policy_keeps_its_bounds():
    policy = ShapePolicy((30.0,), step=OPEN_STEP)
    with pytest.raises(ValueError, match="longer than the largest container"):
        policy.container_for(policy.largest + 1)
    with pytest.raises(ValueError, match="whole number of 960-sample steps"):
        ShapePolicy((1.01,), step=OPEN_STEP)
    assert [open_token_container(n, 10) for n in (0, 1, 4, 5, 9, 11, 12)] == [4, 4, 4, 8, 11, 11, 11]


@pytest.mark.parametrize("device", ["cuda", "directml"])
def test_accelerators_plan_a_handful_of_closed_shapes(device):
    """Accelerators compile per shape (DirectML) or capture graphs (CUDA): their plan stays a few warmed
    shapes, never open, so a shape outside it is refused (unwarmed_calls), never run."""
    for family in (PARAFORMER, SENSEVOICE):
        policy, ladder = shape_plan(EngineOptions(), device, family)
        assert policy.containers == DEFAULT_GPU_CONTAINERS and policy.step == 0
        decoder = [k for size in policy.sizes for k in token_containers(encoder_frames(size), ladder)]
        assert len(policy.sizes) + len(decoder) <= 8


def test_the_cpu_plans_open_shapes_for_a_paraformer_only():
    policy, ladder = shape_plan(EngineOptions(), "cpu", PARAFORMER)
    assert policy.step == OPEN_STEP and policy.containers == (30.0,) and ladder == ()
    assert [token_containers(encoder_frames(size), ladder) for size in policy.sizes] == [(501,)]  # one warmed
    for options in (EngineOptions(containers=(1.0, 2.0)), EngineOptions(token_containers=(8, 16)),
                    EngineOptions(share_weights=False)):  # explicit shapes, or a session per shape: all warmed
        assert shape_plan(options, "cpu", PARAFORMER)[0].step == 0
    assert shape_plan(EngineOptions(), "cpu", SENSEVOICE)[0] == ShapePolicy(DEFAULT_CPU_CONTAINERS)
