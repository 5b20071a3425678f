"""`python -m bench train`: seconds per training step of the demo model, for each precision.

The demo model's training is capped by wall-clock time, so its steps per minute decide its accuracy
(docs/benchmarks.md). This times the training loop's own step (export.train_demo.train_step: collation
with augmentation, forward, CTC, backward, optimizer) on real espeak-ng utterances of the training
recipe, after a few warm-up steps, one precision after the other on the same batches.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time

import numpy as np

from export import synth
from export.demo_data import cmvn_from, length_batches, render_features
from export.train_demo import (PRECISIONS, TrainOptions, adamw, build_model, demo_tokens, native_bf16, targets_for,
                         train_step, training_precision)

from .common import cpu_model

# What the default 44-minute budget leaves the training loop after the data and shipping (docs/benchmarks.md).
TRAINING_MINUTES = 36


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--precision", action="append", choices=PRECISIONS,
                        help="precision to time (repeatable; default fp32 and bf16)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per precision (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--utterances", type=int, default=600, help="training utterances to render (default 600)")
    parser.add_argument("--threads", type=int, default=TrainOptions.threads, help="torch threads (default 2)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup < 0 or args.utterances < 1:
        raise ValueError("--steps and --utterances must be positive, --warmup not negative")
    synth.require_espeak()
    import torch

    torch.set_num_threads(args.threads)
    options = TrainOptions(seed=args.seed, threads=args.threads)
    utterances = synth.sample_utterances(args.utterances, args.seed)
    features = render_features(utterances, options.workers, "synthesise")
    tokens = demo_tokens()
    token_ids = {t: i for i, t in enumerate(tokens)}
    word_targets = [targets_for(u.text, token_ids) for u in utterances]
    shift, scale = (torch.from_numpy(a) for a in cmvn_from(features))
    lengths = np.array([len(f) for f in features])
    batches = length_batches(lengths, options.max_frames, np.random.default_rng(args.seed))
    needed = args.warmup + args.steps
    batches = (batches * (needed // len(batches) + 1))[:needed]

    print(f"machine: {cpu_model()}, {os.cpu_count()} logical CPUs, "
          f"native bf16 {native_bf16()}, "
          f"torch {torch.__version__}, {args.threads} threads; "
          f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}, "
          f"1-min load average at start {os.getloadavg()[0]:.2f}")
    print(f"data: {len(features)} utterances, "
          f"batches of at most {options.max_frames} padded frames (mean {np.mean([lengths[b].max() * len(b) for b in batches]):.0f})")
    print(f"| precision | s/step (median) | min-max | steps per {TRAINING_MINUTES} min |")
    print("|---|---|---|---|")
    for requested in args.precision or ["fp32", "bf16"]:
        precision = training_precision(requested)
        torch.manual_seed(args.seed)
        model = build_model(len(tokens)).train()
        optimizer = adamw(model, options)
        generator = torch.Generator().manual_seed(args.seed)
        rng = np.random.default_rng(args.seed)
        seconds = []
        for batch in batches:
            started = time.perf_counter()
            loss = train_step(model, optimizer, [features[i] for i in batch], [word_targets[i] for i in batch],
                              token_ids, shift, scale, options, generator, rng, precision)
            if not torch.isfinite(loss):
                raise RuntimeError(f"{precision}: the loss is not finite")
            seconds.append(time.perf_counter() - started)
        timed = seconds[args.warmup:]
        median = statistics.median(timed)
        print(f"| {precision} | {median:.3f} | {min(timed):.3f}-{max(timed):.3f} | {TRAINING_MINUTES * 60 / median:.0f} |")
    return 0
