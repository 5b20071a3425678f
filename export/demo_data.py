"""The demo model's training data as the training loop sees it: rendered features, CMVN, batches by
length, collation and augmentation (export.train_demo runs the loop; bench.train times it)."""
from __future__ import annotations

import multiprocessing
from typing import TYPE_CHECKING

import numpy as np

from pipeline.audio import N_MELS

from . import synth

if TYPE_CHECKING:
    from .train_demo import TrainOptions

# ---- data ----------------------------------------------------------------------------------------

_FRONTEND = None


def _init_worker() -> None:
    import torch

    from models.frontend import Frontend

    global _FRONTEND
    torch.set_num_threads(1)
    _FRONTEND = Frontend()  # identity CMVN: the raw LFR features


def _features(chunk: list[synth.Utterance]) -> list[np.ndarray]:
    import torch

    out = []
    with torch.no_grad():
        for u in chunk:
            audio = torch.from_numpy(synth.render(u))[None]
            feats, lengths = _FRONTEND(audio, torch.tensor([audio.shape[1]]))
            out.append(feats[0, : int(lengths[0])].numpy().astype(np.float16))
    return out


def render_features(utterances: list[synth.Utterance], workers: int, desc: str) -> list[np.ndarray]:
    """Raw LFR features float16 [T, 560] per utterance, in order (deterministic for any worker count)."""
    from tqdm import tqdm

    chunks = [utterances[i : i + 100] for i in range(0, len(utterances), 100)]
    out: list[np.ndarray] = []
    with multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker) as pool:
        with tqdm(total=len(utterances), desc=desc, unit="utt", disable=None) as bar:
            for feats in pool.imap(_features, chunks):
                out.extend(feats)
                bar.update(len(feats))
    return out


def cmvn_from(features: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(shift = -mean, scale = 1/std) over every frame, float32 [560] each."""
    total = np.zeros(features[0].shape[1])
    squares = np.zeros_like(total)
    count = 0
    for f in features:
        f = f.astype(np.float64)
        total += f.sum(0)
        squares += (f * f).sum(0)
        count += len(f)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 1e-8))
    return (-mean).astype(np.float32), (1.0 / std).astype(np.float32)


# ---- batches and augmentation --------------------------------------------------------------------

def length_batches(lengths: np.ndarray, max_frames: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices grouped by similar length so that longest * count <= max_frames; batch order shuffled."""
    order = np.argsort(lengths + rng.uniform(0, 3, len(lengths)), kind="stable")
    batches, current, longest = [], [], 0
    for i in order:
        longest_next = max(longest, int(lengths[i]))
        if current and longest_next * (len(current) + 1) > max_frames:
            batches.append(np.array(current))
            current, longest_next = [], int(lengths[i])
        current.append(i)
        longest = longest_next
    if current:
        batches.append(np.array(current))
    rng.shuffle(batches)
    return batches


def collate(features: list[np.ndarray], shift, scale, options: TrainOptions | None, generator=None):
    """Pad, augment (when options given) and normalise: (x float32 [B, T, 560], lengths int64 [B])."""
    import torch

    lengths = torch.tensor([len(f) for f in features])
    x = torch.zeros(len(features), int(lengths.max()), features[0].shape[1])
    for i, f in enumerate(features):
        x[i, : len(f)] = torch.from_numpy(f.astype(np.float32))
    if options is not None:
        x = augment(x, lengths, options, generator)
    x = (x + shift) * scale
    return x * (torch.arange(x.shape[1])[None, :] < lengths[:, None])[:, :, None], lengths


def augment(x, lengths, options: TrainOptions, generator):
    """Mel-axis warp (a cheap vocal-tract-length change) and frequency/time masks on raw log-mel LFR rows."""
    import torch

    b, t, d = x.shape
    mel = x.unflatten(2, (d // N_MELS, N_MELS))  # [B, T, 7, 80]
    n = mel.shape[-1]
    alpha = 1.0 + options.mel_warp * (2 * torch.rand(b, generator=generator) - 1)
    src = (torch.arange(n)[None, :] * alpha[:, None]).clamp(0, n - 1)  # [B, 80]
    lo = src.floor().long()
    hi = (lo + 1).clamp(max=n - 1)
    w = (src - lo)[:, None, None, :]
    expand = (b, t, mel.shape[2], n)
    mel = mel.gather(3, lo[:, None, None, :].expand(expand)) * (1 - w) + mel.gather(3, hi[:, None, None, :].expand(expand)) * w
    floor = mel.amin(dim=(1, 2, 3), keepdim=True)  # masked bins become the utterance's quietest value
    for _ in range(options.freq_masks):
        width = torch.randint(0, 9, (b,), generator=generator)
        start = (torch.rand(b, generator=generator) * (n - width)).long()
        bins = torch.arange(n)[None, :]
        hit = ((bins >= start[:, None]) & (bins < (start + width)[:, None]))[:, None, None, :]
        mel = torch.where(hit, floor, mel)
    for _ in range(options.time_masks):
        width = torch.randint(0, 3, (b,), generator=generator)
        start = (torch.rand(b, generator=generator) * (lengths - width).clamp(min=1)).long()
        rows = torch.arange(t)[None, :]
        hit = ((rows >= start[:, None]) & (rows < (start + width)[:, None]))[:, :, None, None]
        mel = torch.where(hit, floor, mel)
    return mel.flatten(2)
