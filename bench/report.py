"""`python -m bench report`: the benchmark sections of docs/benchmarks.md and the latency plot.

Renders from the JSON results that `model --save` and `load --save` wrote (default docs/bench/*.json);
with --run it first runs both benchmarks with the documented settings. Only the text between the
`<!-- bench:begin -->` and `<!-- bench:end -->` markers is replaced (appended when absent), so other
sections of docs/benchmarks.md stay as they are.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
# The load runs the report shows (name -> extra flags): the server's defaults.
LOAD_RESULTS = {"load.json": []}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-result", type=Path, default=DOCS / "bench" / "model.json")
    parser.add_argument("--load-result", type=Path, nargs="+",
                        default=[DOCS / "bench" / name for name in LOAD_RESULTS],
                        help="one or more load results (e.g. two container ladders); the first is the headline")
    parser.add_argument("--out", type=Path, default=DOCS / "benchmarks.md")
    parser.add_argument("--plot", type=Path, default=DOCS / "latency_vs_streams.png")
    parser.add_argument("--notes", type=Path, default=DOCS / "bench" / "notes.md",
                        help="hand-written analysis inserted after the tables (optional)")
    parser.add_argument("--run", action="store_true", help="run `model` and `load` first (minutes)")
    parser.add_argument("--model", type=Path, default=None, help="with --run: the model directory")
    parser.add_argument("--peer", type=Path, default=None, help="with --run: the peer directory")


def run(args: argparse.Namespace) -> int:
    if args.run:
        if args.model is None:
            raise ValueError("--run needs --model DIR")
        model_cmd = [sys.executable, "-m", "bench", "model", str(args.model), "--save", str(args.model_result)]
        if args.peer is not None:
            model_cmd += ["--peer", str(args.peer)]
        load = [sys.executable, "-m", "bench", "load", "--model", str(args.model), "--precision", "int8"]
        commands = [model_cmd] + [load + extra + ["--save", str(path)]
                                  for path, extra in zip(args.load_result, LOAD_RESULTS.values())]
        for command in commands:
            print("$ " + " ".join(command[1:]), file=sys.stderr)
            subprocess.run(command, cwd=ROOT, check=False)
    model = _read(args.model_result)
    loads = [r for r in (_read(path) for path in args.load_result) if r is not None]
    if model is None and not loads:
        names = ", ".join(map(str, [args.model_result, *args.load_result]))
        raise ValueError(f"no results to report: none of {names} exists")
    if any(r.get("steps") for r in loads):
        plot(loads, args.plot)
    write_section(args.out, render(model, loads, args))
    print(f"wrote {args.out}" + (f" and {args.plot}" if loads else ""), file=sys.stderr)
    return 0


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("command") not in ("model", "load"):
        raise ValueError(f"{path}: not a bench result")
    return data


def write_section(path: Path, section: str) -> None:
    block = f"{BEGIN}\n{section.rstrip()}\n{END}\n"
    text = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmarks\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _machine_line(m: dict[str, Any]) -> str:
    return (f"{m['cpu']}, {m['cores']} cores ({', '.join(m.get('isa', []))}), {m['memory_gib']} GiB, "
            f"{m['os']}, Python {m['python']}, onnxruntime {m['onnxruntime']}; run {m['date']}, "
            f"1-min load average at start {m['loadavg_1m']}")


def _f(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def render(model: dict | None, loads: list[dict], args: argparse.Namespace) -> str:
    out = ["## Speed and capacity (bench)", "",
           "Regenerate: see [How to regenerate](#how-to-regenerate) below. Figures are medians of repeated "
           "runs after warm-up; the spread is min-max. Timings on a shared 2-core machine are noisy: the load "
           "average at the start of each run is recorded with it.", ""]
    if model is not None:
        out += render_model(model)
    for i, load in enumerate(loads):
        out += render_load(load, args, plot=i == len(loads) - 1)
    notes = getattr(args, "notes", None)
    if notes is not None and Path(notes).is_file():
        out += [Path(notes).read_text(encoding="utf-8").rstrip(), ""]
    out += ["### How to regenerate", "", "```sh",
            "python -m export sensevoice --random-init full --precision fp32,int8 --out /tmp/sv_full   # ~3 min",
            "/opt/funasr-venv/bin/python -m bench.make_peer --out /tmp/sv_peer               # needs funasr",
            "python -m bench model /tmp/sv_full --peer /tmp/sv_peer --profile /tmp/sv_prof "
            "--save docs/bench/model.json",
            *(f"python -m bench load --model /tmp/sv_full --precision int8 {' '.join(extra)} "
              f"--save docs/bench/{name}".replace("  ", " ") for name, extra in LOAD_RESULTS.items()),
            "python -m bench report        # this section and docs/latency_vs_streams.png",
            "```", "", "(or `python -m bench report --run --model /tmp/sv_full --peer /tmp/sv_peer`)", ""]
    return "\n".join(out)


def render_model(r: dict[str, Any]) -> list[str]:
    d = r.get("dimensions", {})
    out = ["### One inference", "",
           f"- Machine: {_machine_line(r['machine'])}",
           f"- Model: `{r['model']}` ({d.get('num_blocks')}+{d.get('tp_blocks')} layers, {d.get('output_size')} dims, "
           f"vocabulary {d.get('vocab_size')}; source {r['source'].get('kind')}), device {r['device']}, "
           f"threads {r['threads'] or 'default'}, {r['repeats']} timed runs after {r['warmup']} warm-up",
           f"- Command: `{r.get('argv') or 'python -m bench model ' + r['model_dir']}`", ""]
    if r.get("error"):
        out += [f"**Incomplete run:** {r['error']}", ""]
    for precision, part in r["precisions"].items():
        e = part.get("engine")
        if not e:
            continue
        out += [f"#### {precision}", "",
                f"Engine (ladder {', '.join(f'{c:g}' for c in e['containers'])} s): sessions created in "
                f"{e['session_seconds']:.2f} s, warmed in {e['warmup_seconds']:.2f} s, "
                f"peak RSS {e['peak_rss_mib']} MiB "
                f"({e.get('rss_added_mib', '-')} MiB added) "
                f"(weights shared between sessions: {e['shared_weights_mib']} MiB)."]
        f = part.get("fixed")
        if f and f is not e:
            out += [f"One 30 s container: session {f['session_seconds']:.2f} s, warm-up {f['warmup_seconds']:.2f} s, "
                    f"{f.get('rss_added_mib', '-')} MiB resident memory added (built next to the ladder engine)."]
        out += ["", "| container | median s | min-max s | RTF |", "|---|---|---|---|"]
        for key, s in e["per_container"].items():
            out.append(f"| {key} s | {s['median']:.3f} | {s['min']:.3f}-{s['max']:.3f} | {s['rtf']:.3f} |")
        if f and f is not e:
            s = f["per_container"]["30"]
            out.append(f"| 30 s (alone) | {s['median']:.3f} | {s['min']:.3f}-{s['max']:.3f} | {s['rtf']:.3f} |")
        policies = part.get("policies", {})
        names = [n for n in ("fixed", "ladder", "exact", "peer") if n in policies]
        if names:
            out += ["", "Seconds per segment under each shape policy (fixed: one 30 s container; ladder: the smallest "
                    "container that holds it; exact: free shape at its length; peer: FunASR's export run as "
                    "funasr_onnx runs it, frontend included) and our exact-length time over the peer's:", "",
                    "| segment | " + " | ".join(names) + " | exact / peer |", "|---" * (len(names) + 2) + "|"]
            ratio = part.get("ratio_to_peer", {}).get("exact", {})
            for key in policies[names[0]]:
                cells = " | ".join(_f(policies[n].get(key)) for n in names)
                out.append(f"| {key} s | {cells} | {_f(ratio.get(key))} |")
        for label, prof in (("ours", part.get("profile")), ("peer", part.get("peer_profile"))):
            if prof:
                top = ", ".join(f"{o['op']} {o['ms']:.0f} ms ({o['share']:.0%})" for o in prof["by_op"][:6])
                out += ["", f"Profile, {label}, one 30 s run: {prof['wall_seconds']:.3f} s wall, "
                        f"{prof['kernel_ms']:.0f} ms in kernels: {top}."]
        out.append("")
    t = r.get("targets", {})
    if t:
        out += ["#### Targets (int8)", "", "| target | measured | met |", "|---|---|---|"]
        if "container_30s_int8_seconds" in t:
            out.append(f"| 30 s container <= 0.6 s | {t['container_30s_int8_seconds']:.3f} s | "
                       f"{'yes' if t['container_30s_int8_ok'] else 'no'} |")
        ratio = list(((r["precisions"].get("int8") or {}).get("ratio_to_peer") or {}).get("exact", {}).values())
        if ratio:
            median = statistics.median(ratio)
            out.append(f"| our graph <= 1.05x the peer at equal length | median {median:.2f}x, range "
                       f"{min(ratio):.2f}-{max(ratio):.2f}x over {len(ratio)} lengths | "
                       f"{'yes' if max(ratio) <= 1.05 else 'at the median only' if median <= 1.05 else 'no'} |")
        out.append("")
    return out


def render_load(r: dict[str, Any], args: argparse.Namespace, plot: bool = True) -> list[str]:
    out = [f"### Concurrent real-time streams, {_setup(r)}", "",
           f"- Machine: {_machine_line(r['machine'])}",
           f"- Server: `{(r.get('server_info') or {}).get('provider', '?')}`, precision {r['precision']}, "
           f"containers {(r.get('server_info') or {}).get('containers', r.get('containers'))}, "
           f"end silence {r['end_silence']} s, partials every {r['partial_interval']} s; "
           f"each stream {r['seconds_per_stream']:g} s of espeak speech and pauses sent in {r['chunk'] * 1000:.0f} ms "
           "chunks at real-time pace; client and server on the same 2 cores",
           f"- Command: `{r.get('argv') or 'python -m bench load --model ' + str(r['model_dir'])}`",
           "", f"**Capacity: {r['capacity']} concurrent real-time streams** with p95 latency beyond the end "
           f"silence under {r['target_p95_beyond_silence']} s and no final lost"
           + (f" ({r['stopped']})" if r.get("stopped") else "") + ".", ""]
    if r.get("error"):
        out += [f"**Incomplete run:** {r['error']}", ""]
    out += ["| streams | finals / utterances | lost | latency p50 / p95 / p99 s | beyond silence p95 s | "
            "after VAD p95 s | partials / speech s | partial interval p50 s | partials dropped | server CPU % (mean) | "
            "server RSS MiB | pass |", "|---" * 12 + "|"]
    for s in r["steps"]:
        lat, srv = s["latency"], s["server"]
        out.append(f"| {s['streams']} | {s['finals']} / {s['utterances']} | {s['lost']} | {_f(lat['p50'], 2)} / "
                   f"{_f(lat['p95'], 2)} / {_f(lat['p99'], 2)} | {_f(s['beyond_silence']['p95'], 2)} | "
                   f"{_f(s['after_vad']['p95'], 2)} | {_f(s['partials_per_speech_second'], 2)} | "
                   f"{_f(s['partial_interval']['p50'], 2)} | {srv.get('partials_dropped', '-')} | "
                   f"{_f(srv.get('cpu_mean'), 0)} | {_f(srv.get('rss_peak_mib'), 0)} | "
                   f"{'yes' if s['passed'] else 'no'} |")
    out += ["", "Latency runs from the moment the end of an utterance's speech was sent to its final's arrival; "
            "the segmenter cannot end a segment before `end silence` has passed, so *beyond silence* = latency - "
            "end silence is what the server adds; *after VAD* counts from the server's own end-of-speech (the "
            "final's `end`) plus the end silence.", ""]
    if plot:
        out += [f"![latency against concurrent streams]({args.plot.name})", ""]
    return out


def _setup(load: dict[str, Any]) -> str:
    """"containers 1,2,4 s, 1 thread": what distinguishes one load run's server from another's."""
    containers = (load.get("server_info") or {}).get("containers", load.get("containers"))
    threads = load.get("threads")
    if threads is None and "--threads" in (load.get("argv") or ""):  # results saved before `threads` was kept
        threads = int(load["argv"].split("--threads", 1)[1].split()[0])
    return f"containers {_containers(containers)} s" + (f", {threads} intra-op thread(s)" if threads else "")


def _containers(containers: Any) -> str:
    return ",".join(f"{c:g}" for c in containers) if isinstance(containers, list) else str(containers)


def plot(loads: list[dict[str, Any]], path: Path) -> None:
    """p95 (and p50) latency beyond the end silence against streams, one line pair per load result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for i, load in enumerate(loads):
        steps = load["steps"]
        n = [s["streams"] for s in steps]
        label = _setup(load)
        color = f"C{i}"
        ax.plot(n, [s["beyond_silence"]["p95"] for s in steps], "s-", color=color, label=f"p95, {label}")
        ax.plot(n, [s["beyond_silence"]["p50"] for s in steps], "o:", color=color, label=f"p50, {label}")
        lost = [s["streams"] for s in steps if s["lost"]]
        if lost:
            ax.plot(lost, [0] * len(lost), "x", color=color, ms=10, label="finals lost")
    first = loads[0]
    ax.axhline(first["target_p95_beyond_silence"], color="red", lw=1, ls="--", label="target (p95)")
    ax.set_xlabel("concurrent real-time streams")
    ax.set_ylabel(f"end of speech to final, beyond the {first['end_silence']:g} s end silence (s)")
    m = first["machine"]
    ax.set_title(f"{first.get('model', 'model')}, {first['precision']}, {m['cpu']} x{m['cores']} cores", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
