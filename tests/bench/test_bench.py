"""Smoke tests of `python -m bench`: both benchmarks on the tiny model, the report, and bad input.

Real processes, sockets and ONNX Runtime sessions; no timing is asserted (speed is what the benchmarks
measure, not what tests check).
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.model import profile_graph
from bench.serverproc import free_port
from pipeline.modeldir import read_model_directory
from pipeline.planner import read_cost_tables
from pipeline.shapes import DEFAULT_CPU_CONTAINERS
from server.config import ServerConfig, cost_tables

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str, timeout: float = 300) -> tuple[int, dict | None, str]:
    """Run the benchmark CLI; (exit code, the last stdout line as JSON or None, stderr)."""
    done = subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    try:
        last = json.loads(lines[-1]) if lines else None
    except ValueError:
        last = None
    return done.returncode, last, done.stderr


async def bench_async(*args: str, timeout: float = 300) -> tuple[int, dict | None, str]:
    """bench() without blocking the event loop (for a server running in this test's loop)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    lines = out.decode().strip().splitlines()
    return process.returncode, json.loads(lines[-1]) if lines else None, err.decode()


def test_model_bench_reports_every_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    save = tmp_path / "model.json"
    code, result, err = bench("model", str(tiny_model_dir), "--repeats", "1", "--warmup", "0",
                              "--lengths", "1,5", "--batch-sizes", "1,4", "--save", str(save))
    assert code == 0, err
    assert result["complete"] and result["command"] == "model"
    assert json.loads(save.read_text()) == result
    for precision in ("fp32", "int8"):
        part = result["precisions"][precision]
        assert set(part["engine"]["per_container"]) == {f"{s:g}" for s in DEFAULT_CPU_CONTAINERS}
        assert part["engine"]["unwarmed_calls"] == 0
        assert part["engine"]["peak_rss_mib"] > 0 and part["engine"]["session_seconds"] > 0
        assert set(part["policies"]) == {"fixed", "ladder", "exact"}
        assert set(part["policies"]["exact"]) == {"1", "5"}
        batches = part["batches"]  # every (batch, container) of the grid; int8 runs one clip per call whatever was asked
        sizes = (1, 4) if precision == "fp32" else (1,)
        assert set(batches["per_shape"]) == {f"{b}x{c:g}s" for c in DEFAULT_CPU_CONTAINERS for b in sizes}
        assert batches["unwarmed_calls"] == 0 and batches["in_graph_decoding"]
        assert all(s["per_segment"] > 0 for s in batches["per_shape"].values())
        assert all(batches["session_seconds"][k] > 0 for k in batches["per_shape"])
    assert "container_30s_int8_seconds" in result["targets"]
    # the saved result is a cost table the server plans from, one per precision
    tables = read_cost_tables(result)
    assert set(tables) == {"fp32", "int8"} and tables["fp32"].device == "cpu"
    assert len(tables["fp32"].seconds) == 2 * len(DEFAULT_CPU_CONTAINERS)
    assert cost_tables(ServerConfig(cost_table=save))["int8"].seconds == tables["int8"].seconds


def test_model_bench_refuses_a_missing_or_foreign_directory(tmp_path: Path) -> None:
    code, _, err = bench("model", str(tmp_path / "nowhere"))
    assert code == 1 and "does not exist" in err
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "model.onnx").write_bytes(b"not ours")
    code, _, err = bench("model", str(tmp_path / "foreign"))
    assert code == 1 and "not a Unipad model directory" in err


def test_model_bench_refuses_a_bad_peer_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    code, _, err = bench("model", str(tiny_model_dir), "--peer", str(tmp_path))
    assert code == 1 and "not a peer directory" in err


def test_load_bench_starts_a_server_and_loses_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    save = tmp_path / "load.json"
    code, result, err = bench("load", "--model", str(tiny_model_dir), "--streams", "2", "--seconds", "6",
                              "--save", str(save))
    assert code == 0, err
    assert result["complete"] and result["capacity"] == 2
    step = result["steps"][0]
    assert step["lost"] == 0 and step["errors"] == 0 and step["finals"] == step["utterances"] >= 2
    assert step["latency"]["p95"] is not None and step["server"]["rss_peak_mib"] > 0

    # The report renders both results into its own section and leaves other sections alone.
    model_json = tmp_path / "model.json"
    code, _, err = bench("model", str(tiny_model_dir), "--precision", "int8", "--repeats", "1", "--warmup", "0",
                         "--lengths", "2", "--skip", "fixed", "--save", str(model_json))
    assert code == 0, err
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Padding invariance\n\nkept\n")
    for _ in range(2):  # idempotent: the second run replaces its section
        code, _, err = bench("report", "--model-result", str(model_json), "--load-result", str(save),
                             "--out", str(doc), "--plot", str(tmp_path / "plot.png"))
        assert code == 0, err
    text = doc.read_text()
    assert "## Padding invariance\n\nkept" in text and text.count("<!-- bench:begin -->") == 1
    assert "Capacity: 2 concurrent" in text and (tmp_path / "plot.png").stat().st_size > 1000


def test_a_lease_summary_shows_the_table_the_load_benchs_server_measured(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two servers (--servers 2, the lease's load-servers step), each measuring its own table; a target no
    step meets, and --keep-going steps on past it (the lease's whole ladder)."""
    code, result, err = bench("load", "--model", str(tiny_model_dir), "--device", "cpu", "--precision", "fp32",
                              "--containers", "4,30", "--batch-sizes", "1,4", "--measure-costs", "--cost-table",
                              str(tmp_path / "costs.json"), "--servers", "2", "--streams", "1,3", "--seconds", "5",
                              "--target", "0.001", "--keep-going", "--save", str(tmp_path / "load.json"))
    assert code == 0, err
    assert result["server_info"]["costs"].startswith("measured (fp32 on cpu")
    assert [s["streams"] for s in result["steps"]] == [1, 3] and result["capacity"] == 0 and "stopped" not in result
    assert all(s["lost"] == 0 and s["finals"] == s["utterances"] and not s["passed"] for s in result["steps"])
    watched = result["steps"][1]["server"]["per_server"]  # streams dealt out in turn: both servers served
    assert len(watched) == 2 and all(w["rss_peak_mib"] > 0 for w in watched)
    assert result["steps"][1]["server"]["partials_sent"] > 0 and result["server_info"]["max_sessions"] == 2
    for name in ("costs.json", "costs-1.json"):  # each server's own table, none written over
        table = read_cost_tables(json.loads((tmp_path / name).read_text()))["fp32"]
        assert set(table.seconds) == {(b, c * 16000) for b in (1, 4) for c in (4, 30)}
    done = subprocess.run([sys.executable, "-m", "bench", "lease", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:2] in (["1", "4s"], ["4", "30s"])]
    assert len(rows) == 2 and all(float(r[2]) > 0 for r in rows), done.stdout  # call ms of each shape
    assert "load on the ladder 4,30" in done.stdout and "CUDA graphs" not in done.stdout
    # The lease's second load (bench/gpu_check.sh load-graph) gets its own table and targets line
    (tmp_path / "load-graph.json").write_text((tmp_path / "load.json").read_text())
    done = subprocess.run([sys.executable, "-m", "bench", "lease", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert "load with CUDA graphs on the ladder 4,30" in done.stdout, done.stdout
    assert "targets with CUDA graphs: finals lost 0" in done.stdout, done.stdout
    (tmp_path / "load-servers.json").write_text((tmp_path / "load.json").read_text())
    done = subprocess.run([sys.executable, "-m", "bench", "lease", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert "load on 2 servers on the ladder 4,30" in done.stdout, done.stdout
    assert "targets on 2 servers: finals lost 0" in done.stdout, done.stdout


def test_a_profile_sums_the_runs_after_the_first(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`bench model --profile`: the first run's allocations (on CUDA, each conv's first call) stay out."""
    path = read_model_directory(tiny_model_dir).onnx_path("fp32")
    result = profile_graph(path, 2.0, 1, tmp_path, "tiny")
    events = json.loads(Path(result["trace"]).read_text())
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    assert len(runs) == 2 and sum(o["nodes"] for o in result["by_op"]) * 2 == len(kernels)
    second = [e for e in kernels if runs[1][0] <= e["ts"] <= runs[1][0] + runs[1][1]]
    assert result["kernel_ms"] == pytest.approx(sum(e["dur"] for e in second) / 1000, abs=0.2)


def test_fsmn_bench_times_four_forms_that_agree(tmp_path: Path) -> None:
    save = tmp_path / "fsmn.json"
    code, _, err = bench("fsmn", "--precision", "fp32", "--shapes", "1x40,2x40", "--layers", "2", "--repeats", "1",
                         "--save", str(save))
    assert code == 0, err
    result = json.loads(save.read_text())
    assert {(r["form"], r["batch"]) for r in result["rows"]} == {(f, b) for f in ("conv2d", "conv1d", "taps", "gather")
                                                                 for b in (1, 2)}
    assert all(r["finite"] and r["max_diff"] < 1e-5 and r["run_ms"] > 0 for r in result["rows"])
    assert set(result["one_session_first_runs"]) == {"conv2d", "conv1d"}
    assert bench("fsmn", "--forms", "conv3d")[0] == 2


def test_streamcost_bench_costs_each_rate_and_stage(tmp_path: Path) -> None:
    save = tmp_path / "streamcost.json"
    code, last, err = bench("streamcost", "--streams", "2", "--seconds", "8", "--save", str(save))
    assert code == 0, err
    assert json.loads(save.read_text()) == last
    assert [r["rate"] for r in last["rates"]] == [16000, 24000]
    for row in last["rates"]:
        assert row["jobs"] > 0 and row["stream_seconds"] >= 16  # partials and finals of two 8 s meetings
        assert row["ms_per_stream_second"]["total"] > 0 and row["core_share_at_512"] > 0
    code, _, err = bench("streamcost", "--streams", "0")
    assert code == 2 and "--streams" in err


def test_load_bench_unreachable_server_fails_clearly() -> None:
    code, result, err = bench("load", "--url", f"ws://127.0.0.1:{free_port()}/v1/stream", "--streams", "1")
    assert code == 1 and "unreachable" in err
    assert result["complete"] is False and result["steps"] == []


def test_load_bench_rejects_a_remote_url() -> None:
    code, _, err = bench("load", "--url", "ws://example.com:80/v1/stream")
    assert code == 2 and "loopback" in err


async def test_load_bench_server_refusing_mid_run_keeps_the_measured_steps(serve_test_server) -> None:
    async with serve_test_server(max_sessions=1) as url:
        code, result, err = await bench_async("load", "--url", url, "--streams", "1,2", "--seconds", "5")
    assert code == 1 and "refused" in err
    assert [s["streams"] for s in result["steps"]] == [1, 2]
    assert result["steps"][0]["passed"] and result["capacity"] == 1
