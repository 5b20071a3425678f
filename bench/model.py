"""`python -m bench model DIR`: what one inference costs, per container and per shape policy.

For each precision (fp32 and int8 on CPU; fp16 too on a GPU):
  * engine     the server's Engine with its container ladder: session creation and warm-up time, peak
               resident memory, and the time of one run per container (median and spread of --repeats
               runs after --warmup untimed ones), as a real-time factor of the container's length;
  * policies   what a segment of L seconds (--lengths, 1-30 s) costs under each shape policy:
               fixed (one 30 s container: every segment pays the 30 s run), ladder (the smallest
               container that holds L), exact (a session with free dimensions run at exactly L);
  * peer       with --peer DIR (bench/make_peer.py): FunASR's own export of the same weights, run
               as funasr_onnx runs it (Python fbank + LFR + CMVN, then one dynamic-shape run), at the same
               lengths; `ratio` = our time / the peer's at equal audio length.
  * batches    (bench/batches.py) seconds per call of every (batch, container) shape of the engine's grid
               (the ladder x --batch-sizes) and each session's build time and memory: the cost table
               (`cost_tables` in the JSON) that the server's --cost-table reads;
--profile DIR writes ONNX Runtime per-node profiles (one 30 s run per graph, on --device) and a per-operator
summary (on CUDA the nodes' times are their launches: kernels run asynchronously).
Tables go to stdout; the last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import gc
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from pipeline.audio import SAMPLE_RATE
from pipeline.batching import choose_batch_sizes
from pipeline.engine import Engine, EngineOptions, default_containers
from pipeline.errors import UnipadError
from pipeline.families import SENSEVOICE, family_of
from pipeline.modeldir import FREE_DIMENSIONS, read_model_directory
from pipeline.providers import provider_config
from pipeline.shapes import ShapePolicy, parse_containers
from server.costs import device_memory_used

from . import batches
from .common import command_line, PeakMemory, emit, machine, mib, speech_audio, summary, time_runs

DEFAULT_LENGTHS = (1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0, 25.0, 30.0)
FIXED_CONTAINER = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="model directory (python -m export)")
    parser.add_argument("--precision", default=None, help="comma list (default: fp32,int8 on CPU, +fp16 on GPUs; "
                        "those exported)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "directml"))
    parser.add_argument("--containers", type=parse_containers, default=None,
                        help="the ladder, seconds (default: the device's, pipeline/shapes.py)")
    parser.add_argument("--lengths", default=",".join(f"{x:g}" for x in DEFAULT_LENGTHS),
                        help="segment lengths in seconds for the policy table")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per shape")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per shape before timing")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: per core)")
    batches.add_arguments(parser)
    parser.add_argument("--peer", type=Path, default=None, help="peer directory from bench/make_peer.py")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: fixed, exact, batches")
    parser.add_argument("--profile", type=Path, default=None, help="write ORT per-node profiles here")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON result to this file")


def parse_lengths(text: str) -> tuple[float, ...]:
    try:
        lengths = tuple(sorted(float(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ValueError(f"--lengths must be comma-separated seconds, got {text!r}") from None
    if not lengths or any(not 0.1 <= x <= 60 for x in lengths):
        raise ValueError(f"--lengths must be between 0.1 and 60 s, got {text!r}")
    return lengths


def plain_options(threads: int, device: str = "cpu", samples: int | None = None) -> ort.SessionOptions:
    """The engine's session settings for `device`, without weight sharing; `samples` free unless given."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_free_dimension_override_by_name(FREE_DIMENSIONS[0], 1)
    if samples is not None:
        so.add_free_dimension_override_by_name(FREE_DIMENSIONS[1], samples)
    for key, value in provider_config(device).session_config.items():
        so.add_session_config_entry(key, value)
    return so


def feed(audio: np.ndarray, length: int) -> dict[str, np.ndarray]:
    return {"audio": audio[None, :], "audio_lengths": np.array([length], np.int32),
            "language": np.array([0], np.int32), "textnorm": np.array([15], np.int32)}


def build_engine(model: Path, precision: str, device: str, containers: tuple[float, ...], threads: int,
                 batch_sizes: tuple[int, ...] | None = None):
    """An Engine built and warmed as the server does it: (engine, session/warm-up times and memory); on
    CUDA each session's device memory is read around its creation and warm-up."""
    out: dict[str, Any] = {"containers": list(containers)}
    with PeakMemory() as memory:
        engine = Engine(model, EngineOptions(device=device, precision=precision, containers=containers,
                                             threads=threads, batch_sizes=batch_sizes))
        if device == "cuda":
            engine.memory_probe = device_memory_used
        t = time.perf_counter()
        engine.load(warm_up=False)
        out["session_seconds"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        engine.warm_up()
        out["warmup_seconds"] = round(time.perf_counter() - t, 3)
    out["provider"] = engine.provider
    out["shared_weights_mib"] = mib(engine.stats.shared_weight_bytes)
    out["rss_before_mib"], out["peak_rss_mib"] = mib(memory.start), mib(memory.peak)
    out["rss_added_mib"] = mib(memory.peak - memory.start)
    return engine, out


def exact_session(path: Path, device: str, threads: int) -> tuple[ort.InferenceSession, float]:
    """One session with a free `samples` dimension (runs at any length) and its creation time."""
    config = provider_config(device)
    t = time.perf_counter()
    session = ort.InferenceSession(str(path), plain_options(threads, device), providers=list(config.providers),
                                   provider_options=list(config.provider_options))
    return session, time.perf_counter() - t


def bench_precision(directory, precision: str, ladder: ShapePolicy, lengths: tuple[float, ...], skip: set[str],
                    args) -> dict[str, Any]:
    """Build everything for one precision, then time every shape in interleaved rounds.

    Round-robin (each round runs every shape once) rather than shape after shape: on a shared machine
    the load drifts, and interleaving gives every policy and the peer the same conditions.
    """
    from .common import say

    part: dict[str, Any] = {}
    tasks: list[tuple[str, str, Any]] = []  # (group, key, callable)
    grid_batches = (1,) if "batches" in skip else choose_batch_sizes(args.batch_sizes, args.device, precision)
    say(f"[{precision}] engine with containers {ladder.containers}, batch sizes {grid_batches} ...")
    engine, part["engine"] = build_engine(args.model, precision, args.device, ladder.containers, args.threads,
                                          grid_batches)
    for size in engine.policy.sizes:
        audio = speech_audio(size / SAMPLE_RATE)
        tasks.append(("engine", f"{size / SAMPLE_RATE:g}",
                      lambda e=engine, a=audio, n=size: e.run_padded(a, n, 0, 15)))
    fixed = None
    if "fixed" not in skip and ladder.containers != (FIXED_CONTAINER,):
        say(f"[{precision}] engine with one {FIXED_CONTAINER:g} s container ...")
        fixed, part["fixed"] = build_engine(args.model, precision, args.device, (FIXED_CONTAINER,), args.threads,
                                            (1,))
        audio = speech_audio(FIXED_CONTAINER)
        n = len(audio)
        tasks.append(("fixed", f"{FIXED_CONTAINER:g}", lambda e=fixed, a=audio, n=n: e.run_padded(a, n, 0, 15)))
    if "exact" not in skip:
        session, created = exact_session(directory.onnx_path(precision), args.device, args.threads)
        part["exact"] = {"session_seconds": round(created, 3)}
        for seconds in lengths:
            f = feed(speech_audio(seconds), int(round(seconds * SAMPLE_RATE)))
            tasks.append(("exact", f"{seconds:g}", lambda s=session, f=f: s.run(None, f)))
    if "batches" not in skip:
        more, part["batches"] = batches.batch_tasks(engine)
        tasks += more
    if args.peer is not None and precision in ("fp32", "int8"):
        from .peer import PeerModel

        config = provider_config(args.device)
        peer = PeerModel(args.peer, precision, plain_options(args.threads, args.device),
                         providers=list(config.providers))
        part["peer"] = {"graph": peer.info["files"][precision], "frontend": {}}
        for seconds in lengths:
            audio = speech_audio(seconds)
            tasks.append(("peer", f"{seconds:g}", lambda p=peer, a=audio: p.run(a)))
            part["peer"]["frontend"][f"{seconds:g}"] = summary(time_runs(lambda p=peer, a=audio: p.features(a), 0, 1))
    say(f"[{precision}] timing {len(tasks)} shapes x {args.warmup} + {args.repeats} interleaved rounds ...")
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for round_ in range(args.warmup + args.repeats):
        for group, key, fn in tasks:
            t = time.perf_counter()
            fn()
            if round_ >= args.warmup:
                times[group, key].append(time.perf_counter() - t)
    for (group, key), values in times.items():
        if group == "batches":
            continue
        stats = summary(values)
        stats["rtf"] = round(stats["median"] / float(key), 4)
        table = "per_container" if group in ("engine", "fixed") else "per_length"
        part.setdefault(group, {}).setdefault(table, {})[key] = stats
    part["engine"]["unwarmed_calls"] = engine.stats.unwarmed_calls
    if fixed is None and ladder.containers == (FIXED_CONTAINER,):
        part["fixed"] = part["engine"]
    if "batches" in part:
        part["batches"] = batches.finish(part["batches"], {k: summary(v) for (g, k), v in times.items()
                                                           if g == "batches"}, engine, precision, args.device,
                                         directory.manifest.name)
    del engine, fixed
    gc.collect()
    part["policies"] = policy_table(part, lengths, ladder)
    part["ratio_to_peer"] = ratios(part["policies"])
    return part


def policy_table(result: dict[str, Any], lengths: tuple[float, ...], ladder: ShapePolicy) -> dict[str, dict]:
    """Median seconds for a segment of each length under each policy (and the peer), from the timings.

    On these graphs a run's cost depends only on its shape (padding is masked, not skipped), so a
    segment's cost under a container policy is its container's measured time.
    """
    table: dict[str, dict] = defaultdict(dict)
    for seconds in lengths:
        key = f"{seconds:g}"
        n = int(round(seconds * SAMPLE_RATE))
        if "fixed" in result:
            table["fixed"][key] = result["fixed"]["per_container"][f"{FIXED_CONTAINER:g}"]["median"]
        if "engine" in result and n <= ladder.largest:
            container = f"{ladder.container_for(n) / SAMPLE_RATE:g}"
            table["ladder"][key] = result["engine"]["per_container"][container]["median"]
        if "exact" in result:
            table["exact"][key] = result["exact"]["per_length"][key]["median"]
        if "peer" in result:
            table["peer"][key] = result["peer"]["per_length"][key]["median"]
    return dict(table)


def ratios(table: dict[str, dict]) -> dict[str, dict]:
    """Our time / the peer's at equal audio length, per policy."""
    if "peer" not in table:
        return {}
    return {policy: {k: round(v / table["peer"][k], 3) for k, v in times.items() if k in table["peer"]}
            for policy, times in table.items() if policy != "peer"}


def profile_graph(path: Path, seconds: float, threads: int, out_dir: Path, tag: str,
                  device: str = "cpu") -> dict[str, Any]:
    """One run at `seconds` (samples fixed) with ORT profiling; per-operator-type totals, largest first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n = int(round(seconds * SAMPLE_RATE))
    so = plain_options(threads, device, n)
    so.enable_profiling = True
    so.profile_file_prefix = str(out_dir / tag)
    config = provider_config(device)
    session = ort.InferenceSession(str(path), so, providers=list(config.providers),
                                   provider_options=list(config.provider_options))
    audio = speech_audio(seconds)
    session.run(None, feed(audio, n))  # first run: allocations (left out of the summary)
    t = time.perf_counter()
    session.run(None, feed(audio, n))
    wall = time.perf_counter() - t
    trace = Path(session.end_profiling())
    return {"wall_seconds": round(wall, 4), "trace": str(trace), **summarize_profile(trace)}


def summarize_profile(trace: Path) -> dict[str, Any]:
    """Kernel time per operator type (ms per run) from an ORT profile, largest first, over the runs after the
    first: a session's first run pays its allocations and, on CUDA, each conv's first call (the third lease:
    787 ms of Conv in a first run whose later runs take 27 ms in all), which is not what a profile asks."""
    events = json.loads(trace.read_text(encoding="utf-8"))
    windows = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                     if e.get("cat") == "Session" and e.get("name") == "model_run")
    steady = windows[1:] or windows
    runs = max(len(steady), 1)
    per_op: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and (
                not steady or any(start <= e.get("ts", 0) <= end for start, end in steady)):
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] += e.get("dur", 0) / 1000.0 / runs
            count[op] += 1
    total = sum(per_op.values())
    ops = sorted(per_op.items(), key=lambda kv: -kv[1])
    return {"kernel_ms": round(total, 1),
            "by_op": [{"op": op, "ms": round(ms, 1), "share": round(ms / total, 3) if total else 0,
                       "nodes": count[op] // runs} for op, ms in ops]}


def run(args: argparse.Namespace) -> int:
    from .common import say

    lengths = parse_lengths(args.lengths)
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError("--repeats must be >= 1 and --warmup >= 0")
    directory = read_model_directory(args.model)  # ModelLoadError: missing or not ours
    if family_of(directory.manifest) is not SENSEVOICE:
        raise UnipadError(f"{args.model}: architecture {directory.manifest.architecture!r}, not {SENSEVOICE.architecture}")
    if args.peer is not None:
        from .peer import read_peer_info

        read_peer_info(args.peer)
    exported = list(directory.manifest.files)
    wanted = args.precision.split(",") if args.precision else [p for p in ("fp32", "int8", "fp16") if
                                                               p != "fp16" or args.device != "cpu"]
    precisions = [p for p in wanted if p in exported]
    if args.precision and len(precisions) != len(wanted):
        raise UnipadError(f"{args.model}: precision(s) {', '.join(set(wanted) - set(exported))} not exported "
                          f"(has {', '.join(exported)})")
    ladder = ShapePolicy(args.containers or default_containers(args.device))
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    result: dict[str, Any] = {
        "command": "model", "argv": command_line(), "model": directory.manifest.name, "model_dir": str(args.model),
        "source": directory.manifest.source, "dimensions": directory.manifest.dimensions,
        "device": args.device, "threads": args.threads, "repeats": args.repeats, "warmup": args.warmup,
        "lengths": list(lengths), "ladder": list(ladder.containers), "machine": machine(),
        "peer": None if args.peer is None else str(args.peer), "precisions": {}, "complete": False,
    }
    try:
        for precision in precisions:
            result["precisions"][precision] = {}
            part = measure_in_child(directory, precision, ladder, lengths, skip, args)
            result["precisions"][precision] = part
            if "batches" in part:  # what --cost-table reads (pipeline/planner.py read_cost_tables)
                result.setdefault("cost_tables", {})[precision] = part["batches"]["cost_table"]
            print_precision(precision, part, lengths)
        result["complete"] = True
    except KeyboardInterrupt:
        result["error"] = "interrupted"
    except Exception as exc:  # noqa: BLE001 - report what was measured, then fail
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["targets"] = targets(result)
    emit(result, args.save)
    if "error" in result:
        say(f"error: {result['error']}")
        return 1
    return 0


def measure_precision(directory, precision: str, ladder: ShapePolicy, lengths: tuple[float, ...], skip: set[str],
                      args) -> dict[str, Any]:
    """Everything measured for one precision (timings, then the optional profiles)."""
    from .common import say

    part = bench_precision(directory, precision, ladder, lengths, skip, args)
    if args.profile is not None:
        say(f"[{precision}] profiling a {FIXED_CONTAINER:g} s run ...")
        part["profile"] = profile_graph(directory.onnx_path(precision), FIXED_CONTAINER, args.threads,
                                        args.profile, f"ours_{precision}", args.device)
        if args.peer is not None and precision in ("fp32", "int8") and args.device == "cpu":
            part["peer_profile"] = peer_profile(args.peer, precision, args.threads, args.profile)
    return part


def measure_in_child(directory, precision: str, ladder: ShapePolicy, lengths: tuple[float, ...], skip: set[str],
                     args) -> dict[str, Any]:
    """measure_precision in a fresh process: memory freed by an earlier precision stays in this process's
    heap (the allocator keeps it), which would inflate the next one's resident-memory figures."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure_precision, directory, precision, ladder, lengths, skip, args).result()


def peer_profile(peer_dir: Path, precision: str, threads: int, out_dir: Path) -> dict[str, Any]:
    from .peer import PeerModel

    so = plain_options(threads, "cpu")
    so.enable_profiling = True
    so.profile_file_prefix = str(out_dir / f"peer_{precision}")
    peer = PeerModel(peer_dir, precision, so)
    audio = speech_audio(FIXED_CONTAINER)
    peer.run(audio)
    t = time.perf_counter()
    peer.run(audio)
    wall = time.perf_counter() - t
    trace = Path(peer.session.end_profiling())
    return {"wall_seconds": round(wall, 4), "trace": str(trace), **summarize_profile(trace)}


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's speed targets, checked where the figures exist (int8)."""
    part = result["precisions"].get("int8") or {}
    out: dict[str, Any] = {}
    fixed = (part.get("fixed") or {}).get("per_container", {}).get(f"{FIXED_CONTAINER:g}")
    if fixed:
        out["container_30s_int8_seconds"] = fixed["median"]
        out["container_30s_int8_ok"] = fixed["median"] <= 0.6
    r = part.get("ratio_to_peer") or {}
    if r.get("exact"):
        worst = max(r["exact"].values())
        out["exact_vs_peer_worst"] = worst
        out["exact_vs_peer_ok"] = worst <= 1.05
    if r.get("fixed") and "30" in r["fixed"]:
        out["container_30s_vs_peer_30s"] = r["fixed"]["30"]
    return out


def print_precision(precision: str, part: dict[str, Any], lengths: tuple[float, ...]) -> None:
    engine = part["engine"]
    print(f"\n== {precision} on {engine['provider']}: sessions {engine['session_seconds']:.2f} s, "
          f"warm-up {engine['warmup_seconds']:.2f} s, peak RSS {engine['peak_rss_mib']} MiB")
    print(f"{'container':>10} {'median s':>9} {'min':>7} {'max':>7} {'RTF':>7}")
    for key, s in engine["per_container"].items():
        print(f"{key + ' s':>10} {s['median']:9.3f} {s['min']:7.3f} {s['max']:7.3f} {s['rtf']:7.3f}")
    policies = part["policies"]
    names = [p for p in ("fixed", "ladder", "exact", "peer") if p in policies]
    print(f"{'segment':>8} " + " ".join(f"{n:>8}" for n in names) + ("   ours/peer (exact)" if "peer" in names else ""))
    for seconds in lengths:
        key = f"{seconds:g}"
        row = " ".join(f"{policies[n].get(key, float('nan')):8.3f}" for n in names)
        ratio = part["ratio_to_peer"].get("exact", {}).get(key)
        print(f"{key + ' s':>8} {row}" + (f"   {ratio:.3f}" if ratio is not None else ""))
    if "batches" in part:
        batches.print_batches(part["batches"])
