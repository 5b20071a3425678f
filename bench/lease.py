"""`python -m bench lease OUT`: the summary table of one GPU lease (bench/gpu_check.sh lease), from what it
left in OUT: steps.tsv (each step's limit, exit status and seconds), costs.json (the cost table the load's
server measured; model.json, a `bench model` one, where a lease made it), load.json (the ladder under load;
load-graph.json, the same with CUDA graphs; load-servers.json, several servers on the one GPU),
fsmn.json (the FSMN conv's formulations), segment30.json (one 30 s segment and its profile), verify-*.txt and
cuda-tests.txt (tests/pipeline/test_cuda.py's outcome).
Prints what was measured against the issue's targets; a step that did not finish shows as such.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# Issue 34's targets on one H100.
TARGET_P95 = 0.5  # seconds beyond the end silence, at 512 streams
TARGET_PARTIALS = 1.5  # per speech-second, at 256 streams
TARGET_SEGMENT = 0.010  # seconds for one 30 s fp16 segment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="the lease's $OUT")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return []


def last_json(path: Path) -> dict[str, Any] | None:
    """The last line of a log that is a JSON object (export verify prints its figures so)."""
    for line in reversed(read_lines(path)):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def steps(out: Path) -> list[list[str]]:
    try:
        return [line.split("\t") for line in (out / "steps.tsv").read_text(encoding="utf-8").splitlines() if line]
    except OSError:
        return []


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    print(f"== lease summary ({out})")
    print(f"{'step':<14} {'limit s':>8} {'took s':>7} {'exit':>5}")
    for name, limit, code, took in steps(out):
        print(f"{name:<14} {limit:>8} {took:>7} {code + (' (timed out)' if code in ('124', '137') else ''):>5}")
    tables = (read_json(out / "model.json") or {}).get("cost_tables") or {}
    measured = read_json(out / "costs.json")  # the table the load's server measured after its warm-up
    if not tables and measured and measured.get("calls"):
        tables = {measured["precision"]: measured}
    if tables:
        for precision, table in tables.items():
            print(f"\n{precision} on {table['provider']}: seconds per call (table), build seconds, memory per session")
            print(f"{'batch':>6} {'container':>9} {'call ms':>8} {'ms/seg':>7} {'build s':>8} {'GPU MiB':>8} {'RSS MiB':>8}")
            for c in table["calls"]:
                print(f"{c['batch']:>6} {c['container']:>8g}s {c['seconds'] * 1e3:8.2f} {c['seconds'] * 1e3 / c['batch']:7.2f} "
                      f"{c.get('build_seconds', '-')!s:>8} {c.get('device_mib', '-')!s:>8} {c.get('rss_mib', '-')!s:>8}")
    else:
        print("\nno cost table (costs.json and model.json missing or incomplete)")
    load = read_json(out / "load.json")
    print_load(load, "")
    graph = read_json(out / "load-graph.json")
    if (out / "load-graph.json").exists():  # the step ran: said even when it left nothing readable
        print_load(graph, " with CUDA graphs")
    several = read_json(out / "load-servers.json")
    if (out / "load-servers.json").exists():
        print_load(several, f" on {(several or {}).get('servers', 'several')} servers"
                   + (", CUDA graphs" if (several or {}).get("cuda_graph") else ""))
    segment = read_json(out / "segment30.json")
    seconds = None
    if segment:
        for precision, part in segment.get("precisions", {}).items():
            # the serving path (decoding outputs only), not run_padded's full log-probs
            seconds = ((part.get("batches", {}).get("per_shape", {}).get("1x30s")
                        or part.get("engine", {}).get("per_container", {}).get("30") or {}).get("median"))
            profile = part.get("profile") or {}
            print(f"\none 30 s {precision} segment: {seconds} s; profile: {profile.get('kernel_ms')} ms in nodes, top "
                  + ", ".join(f"{o['op']} {o['ms']} ms" for o in profile.get("by_op", [])[:5]))
    fsmn = read_json(out / "fsmn.json")
    if fsmn:
        print(f"\n{fsmn['layers']} FSMN blocks, {fsmn['precision']} on {fsmn['device']}: create, first run, later runs")
        for r in fsmn["rows"]:
            print(f"  {r['form']:<7} {r['batch']:>3}x{r['frames']:<4} {r['create_s']:6.2f} s {r['first_run_s']:7.3f} s "
                  f"{r['run_ms']:8.2f} ms  max |diff| {r['max_diff']:.1e}")
        for form, firsts in fsmn.get("one_session_first_runs", {}).items():
            print(f"  {form}, one session of free shape, first run at each shape in turn: {firsts} s")
    outcome = [line for line in read_lines(out / "cuda-tests.txt") if " passed" in line or " failed" in line
               or " skipped" in line or " error" in line]
    if outcome:
        print(f"GPU-only tests (tests/pipeline/test_cuda.py): {outcome[-1].strip('= ')}")
    for name in ("paraformer", "qwen3"):
        figures = last_json(out / f"verify-{name}.txt")
        print(f"verify {name}: " + ("no result" if figures is None else f"passed {figures.get('passed')}"))
    print("\ntargets:", ", ".join(targets(load, seconds)) or "none measured")
    if graph:
        print("targets with CUDA graphs:", ", ".join(targets(graph, None)) or "none measured")
    if several:
        print(f"targets on {several.get('servers')} servers:", ", ".join(targets(several, None)) or "none measured")
    return 0


def print_load(load: dict | None, label: str) -> None:
    if not load:
        print(f"\nno load result{label}")
        return
    print(f"\nload{label} on the ladder {load.get('containers')}, batch sizes {load.get('batch_sizes')}, costs from "
          f"{load.get('cost_table') or 'the model'}; server ready in {load.get('server_ready_seconds')} s")
    print(f"{'streams':>7} {'p95 s':>7} {'p50 s':>7} {'part/sp-s':>9} {'lost':>5} {'unwarmed':>8} {'CPU %':>6} {'pass':>5}")
    for s in load.get("steps", []):
        server = s.get("server", {})
        print(f"{s['streams']:>7} {s['beyond_silence']['p95']!s:>7} {s['beyond_silence']['p50']!s:>7} "
              f"{s['partials_per_speech_second']!s:>9} {s['lost']:>5} {server.get('unwarmed_shape_calls', '-')!s:>8} "
              f"{server.get('cpu_mean', '-')!s:>6} {str(s['passed']):>5}")
    if load.get("error") or load.get("stopped"):
        print(f"  ({load.get('error') or load.get('stopped')})")


def targets(load: dict | None, segment: float | None) -> list[str]:
    found = []
    by_streams = {s["streams"]: s for s in (load or {}).get("steps", [])}
    if 512 in by_streams:
        p95 = by_streams[512]["beyond_silence"]["p95"]
        found.append(f"512 streams p95 {p95} s ({'met' if p95 is not None and p95 <= TARGET_P95 else 'missed'})")
    if 256 in by_streams:
        rate = by_streams[256]["partials_per_speech_second"] or 0
        found.append(f"partials at 256 {rate}/speech-s ({'met' if rate >= TARGET_PARTIALS else 'missed'})")
    if by_streams:
        lost = sum(s["lost"] for s in by_streams.values())
        unwarmed = max((s.get("server", {}).get("unwarmed_shape_calls", 0) for s in by_streams.values()), default=0)
        found.append(f"finals lost {lost}, unwarmed calls {unwarmed}")
    if segment is not None:
        found.append(f"30 s segment {segment * 1e3:.1f} ms ({'met' if segment <= TARGET_SEGMENT else 'missed'})")
    return found
