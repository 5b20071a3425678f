from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.audio import SAMPLE_RATE, seconds_to_samples
from pipeline.shapes import DEFAULT_CPU_CONTAINERS, DEFAULT_GPU_CONTAINERS, ShapePolicy, parse_containers


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
