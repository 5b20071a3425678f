"""Synthetic English speech for the demo model: espeak-ng voices, a fixed vocabulary, augmentation.

Everything is derived from a seed: the same (seed, count) gives the same texts, voices, augmentation and
so the same samples, whatever the number of worker processes. espeak-ng runs as a subprocess
(about 10 ms per call); its 22.05 kHz output is resampled to SAMPLE_RATE with soxr, where speed
perturbation costs nothing (we resample from a rate scaled by the speed factor).

Voices are `BASE+VARIANT`. `en-gb+VARIANT` silently ignores the variant, so `en` stands for British
English; unknown variant names fall back silently too, hence the fixed, hash-checked list below (`fast`
equals no variant; `caleb`, `klatt` and `klatt6` are identical: only `klatt` is kept).
"""
from __future__ import annotations

import dataclasses
import io
import shutil
import subprocess
import zlib
from dataclasses import dataclass

import numpy as np
import soundfile
import soxr

from pipeline.audio import SAMPLE_RATE, Resampler

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "oh")
COMMANDS = (
    "start", "stop", "next", "previous", "yes", "no", "up", "down", "left", "right", "on", "off",
    "open", "close", "play", "pause", "go", "back", "help", "cancel", "save", "delete", "undo", "select",
    "enter", "home", "menu", "repeat", "louder", "quieter", "faster", "slower", "call", "send", "show", "hide",
)
# Short phrases; their extra words (turn, volume, ...) become vocabulary too.
PHRASES = (
    "turn on", "turn off", "go back", "volume up", "volume down", "next page", "previous page",
    "scroll up", "scroll down", "zoom in", "zoom out", "select all", "play music", "stop music",
    "open the door", "close the door", "call home", "thank you", "good morning", "good night",
    "show the menu", "hide the menu", "start recording", "stop recording", "send message",
)
VOCABULARY = tuple(dict.fromkeys(DIGITS + COMMANDS + tuple(w for p in PHRASES for w in p.split())))

VOICE_BASES = ("en", "en-us", "en-029", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd")
VARIANTS = (
    "Alex", "Alicia", "Andrea", "Andy", "Annie", "AnxiousAndy", "Demonic", "Denis", "Diogo", "Gene",
    "Gene2", "Henrique", "Hugo", "Jacky", "Lee", "Marco", "Mario", "Michael", "Mike", "Nguyen",
    "RicishayMax", "RicishayMax2", "RicishayMax3", "Storm", "Tweaky", "UniRobot", "adam", "anika",
    "anikaRobot", "announcer", "antonio", "aunty", "belinda", "benjamin", "boris", "croak", "david", "ed",
    "edward", "edward2", "f1", "f2", "f3", "f4", "f5", "grandma", "grandpa", "gustave", "iven", "iven2",
    "iven3", "iven4", "john", "kaukovalta", "klatt", "klatt2", "klatt3", "klatt4", "klatt5", "linda", "m1",
    "m2", "m3", "m4", "m5", "m6", "m7", "m8", "marcelo", "max", "michel", "miguel", "norbert", "pablo",
    "paul", "pedro", "quincy", "rob", "robert", "robosoft", "robosoft2", "robosoft3", "robosoft4",
    "robosoft5", "robosoft6", "robosoft7", "robosoft8", "sandro", "shelby", "steph", "steph2", "steph3",
    "travis", "victor", "whisper", "whisperf", "zac",
)
# Never heard in training: the held-out set speaks only with these timbres (with every base accent).
HELDOUT_VARIANTS = (
    "Annie", "Gene2", "Hugo", "RicishayMax2", "anikaRobot", "aunty", "edward2", "f4", "iven3", "klatt4",
    "m6", "robosoft5", "steph2", "victor",
)
TRAIN_VARIANTS = ("",) + tuple(v for v in VARIANTS if v not in HELDOUT_VARIANTS)  # "" = the base voice

ESPEAK_RATE = 22050
NOISE_KINDS = ("white", "pink", "brown")  # of the noise-only training utterances
# Rooms and the noise under a speaker (bench silence and vad, and the room-noise augmentation): "room" is
# pink noise under a low-pass (ventilation, traffic through a wall: little above ROOM_LOWPASS_HZ) with a
# diffuse tail (ROOM_RT60), the way a room colours whatever hums in it.
# "babble" is other people talking far off: BABBLE_TALKERS time-reversed espeak-ng voices, so it sounds and
# moves like speech but holds no word the model could learn to transcribe.
ROOM_NOISE_KINDS = ("pink", "brown", "room", "babble")
ROOM_LOWPASS_HZ = 1000.0
ROOM_RT60 = 0.4
BABBLE_TALKERS = 5
BABBLE_WORDS = 16  # per talker's sentence, looped to the noise's length
CLIENT_RATE = 24000  # OpenAI Realtime's rate: every Realtime client's audio reaches the server at it


@dataclass(frozen=True)
class Recipe:
    """The data recipe; recorded in the model manifest's `source`."""

    speed: tuple[float, float] = (0.91, 1.10)  # speed perturbation (tempo and pitch together)
    words_per_minute: tuple[int, int] = (120, 220)  # espeak-ng -s
    pitch: tuple[int, int] = (15, 85)  # espeak-ng -p
    word_gap: tuple[int, int] = (0, 12)  # espeak-ng -g, in 10 ms units
    gain: tuple[float, float] = (0.25, 1.5)
    lead_silence: tuple[float, float] = (0.0, 0.3)  # seconds (the segmenter keeps a 0.3 s pre-roll)
    trail_silence: tuple[float, float] = (0.0, 1.0)  # seconds
    noise_probability: float = 0.6
    snr_db: tuple[float, float] = (15.0, 40.0)  # white noise
    tilt: tuple[float, float] = (-0.6, 0.6)  # first-order spectral tilt y[n] = x[n] - a x[n-1]
    max_words: int = 6
    # Utterances of noise alone (empty transcript), so that noisy segments decode to no words.
    noise_only_probability: float = 0.05
    noise_only_dbfs: tuple[float, float] = (-60.0, -5.0)  # RMS level
    noise_only_seconds: tuple[float, float] = (0.5, 8.0)
    # Rooms, on training speech only: a feedback echo (as espeak-ng's own `echo` voice setting makes,
    # and as hard walls do) or a diffuse reverberation tail. Drawn from a stream of their own, so texts,
    # voices and the held-out set stay those of a recipe without rooms.
    echo_probability: float = 0.25
    echo_delay: tuple[float, float] = (0.005, 0.3)  # seconds
    echo_feedback: tuple[float, float] = (0.1, 0.45)  # gain of each repetition
    reverb_probability: float = 0.2
    rt60: tuple[float, float] = (0.15, 0.7)  # seconds for the tail to fall 60 dB
    direct_to_reverb_db: tuple[float, float] = (0.0, 12.0)
    # Long silences, on training speech only: a lead, a trail or both drawn from `long_silence` instead
    # of the short ones, so the model learns to say nothing in them (issue 25; off by default, 0.35 for the
    # shipped demo: models/demo/manifest.json). A stream of their own, so texts, voices and the held-out set
    # stay the same.
    long_silence_probability: float = 0.0
    long_silence: tuple[float, float] = (0.3, 2.0)  # seconds
    # Room noise, on training speech only (issue 36): pink, brown or room noise (ROOM_NOISE_KINDS) at a level
    # of `room_noise_dbfs` over the whole utterance, lead and trail included, so the model hears it around
    # and under the speech as in a quiet room; and a 16 -> 24 -> 16 kHz round trip (what a Realtime
    # client's audio went through). Off by default; a stream of their own, so texts, voices, rooms and the
    # held-out set stay those of a recipe without them.
    room_noise_probability: float = 0.0
    room_noise_dbfs: tuple[float, float] = (-60.0, -35.0)
    round_trip_probability: float = 0.0


@dataclass(frozen=True)
class Utterance:
    """One synthetic utterance: what is said, by which voice, and how it is altered afterwards."""

    text: str
    voice: str  # espeak-ng -v argument, e.g. "en-us+m3"
    words_per_minute: int
    pitch: int
    word_gap: int
    speed: float
    gain: float
    lead: float  # seconds of silence before
    trail: float  # seconds of silence after
    snr_db: float | None  # None: no noise
    tilt: float
    noise_seed: int
    noise_kind: str = "white"  # of a noise-only utterance (text ""): "white", "pink" or "brown"
    noise_dbfs: float = 0.0  # its RMS level
    noise_seconds: float = 0.0  # its length
    echo_delay: float = 0.0  # seconds; 0: no echo
    echo_feedback: float = 0.0
    rt60: float = 0.0  # seconds; 0: no reverberation
    direct_to_reverb_db: float = 0.0
    room_noise: str = ""  # a ROOM_NOISE_KINDS kind over the whole utterance; "": none
    room_noise_dbfs: float = 0.0  # its RMS level
    round_trip: bool = False  # through CLIENT_RATE and back, PCM16 on the way


def require_espeak() -> str:
    """The espeak-ng executable, or RuntimeError with a one-line reason."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is not installed (Debian/Ubuntu: apt-get install espeak-ng)")
    return exe


def random_text(rng: np.random.Generator, max_words: int = 6) -> str:
    """1..max_words words: a digit string, command words, short phrases or a command followed by digits."""
    kind = rng.choice(4, p=[0.3, 0.3, 0.25, 0.15])
    n = int(rng.integers(1, max_words + 1))
    if kind == 0:
        words = [DIGITS[i] for i in rng.integers(0, len(DIGITS), n)]
    elif kind == 1:
        words = [COMMANDS[i] for i in rng.integers(0, len(COMMANDS), n)]
    elif kind == 2:
        words = []
        while True:
            phrase = PHRASES[int(rng.integers(len(PHRASES)))].split()
            if words and len(words) + len(phrase) > max_words:
                break
            words += phrase
            if rng.random() < 0.5:
                break
    else:
        words = [COMMANDS[int(rng.integers(len(COMMANDS)))]]
        words += [DIGITS[i] for i in rng.integers(0, len(DIGITS), max(1, n - 1))]
    return " ".join(words[:max_words])


def sample_utterances(
    count: int, seed: int, heldout: bool = False, exclude: frozenset[str] = frozenset(), recipe: Recipe = Recipe()
) -> list[Utterance]:
    """`count` utterance recipes. heldout=True uses only HELDOUT_VARIANTS and skips texts in `exclude`."""
    rng = np.random.default_rng([seed, 1 if heldout else 0])
    room_rng = np.random.default_rng([seed, 2])
    silence_rng = np.random.default_rng([seed, 3])
    noise_rng = np.random.default_rng([seed, 4])
    variants = HELDOUT_VARIANTS if heldout else TRAIN_VARIANTS
    out: list[Utterance] = []
    while len(out) < count:
        if not heldout and rng.random() < recipe.noise_only_probability:
            out.append(Utterance(
                text="", voice="", words_per_minute=0, pitch=0, word_gap=0, speed=1.0, gain=1.0, lead=0.0,
                trail=0.0, snr_db=None, tilt=0.0, noise_seed=int(rng.integers(2**31)),
                noise_kind=NOISE_KINDS[int(rng.integers(len(NOISE_KINDS)))],
                noise_dbfs=float(rng.uniform(*recipe.noise_only_dbfs)),
                noise_seconds=float(rng.uniform(*recipe.noise_only_seconds)),
            ))
            continue
        text = random_text(rng, recipe.max_words)
        if text in exclude:
            continue
        variant = variants[int(rng.integers(len(variants)))]
        base = VOICE_BASES[int(rng.integers(len(VOICE_BASES)))]

        def uniform(bounds: tuple[float, float]) -> float:
            return float(rng.uniform(*bounds))

        out.append(Utterance(
            text=text,
            voice=f"{base}+{variant}" if variant else base,
            words_per_minute=int(rng.integers(recipe.words_per_minute[0], recipe.words_per_minute[1] + 1)),
            pitch=int(rng.integers(recipe.pitch[0], recipe.pitch[1] + 1)),
            word_gap=int(rng.integers(recipe.word_gap[0], recipe.word_gap[1] + 1)),
            speed=uniform(recipe.speed),
            gain=uniform(recipe.gain),
            lead=uniform(recipe.lead_silence),
            trail=uniform(recipe.trail_silence),
            snr_db=uniform(recipe.snr_db) if rng.random() < recipe.noise_probability else None,
            tilt=uniform(recipe.tilt),
            noise_seed=int(rng.integers(2**31)),
            **({} if heldout else room(room_rng, recipe)),
        ))
        if not heldout and recipe.long_silence_probability:
            out[-1] = long_silences(out[-1], silence_rng, recipe)
        if not heldout and (recipe.room_noise_probability or recipe.round_trip_probability):
            out[-1] = room_noise(out[-1], noise_rng, recipe)
    return out


def long_silences(u: Utterance, rng: np.random.Generator, recipe: Recipe) -> Utterance:
    """`u` with, at `recipe.long_silence_probability`, a long lead, a long trail or both."""
    # Always four draws: one utterance's choice never shifts the next one's.
    chance, which = rng.random(), int(rng.integers(3))  # which: 0 lead, 1 trail, 2 both
    lead, trail = (float(rng.uniform(*recipe.long_silence)) for _ in range(2))
    if chance >= recipe.long_silence_probability:
        return u
    return dataclasses.replace(u, lead=lead if which != 1 else u.lead, trail=trail if which != 0 else u.trail)


def room_noise(u: Utterance, rng: np.random.Generator, recipe: Recipe) -> Utterance:
    """`u` with, at the recipe's probabilities, room noise under it and a round trip through CLIENT_RATE."""
    # Always four draws: one utterance's choice never shifts the next one's.
    chance, kind, level, trip = rng.random(), int(rng.integers(len(ROOM_NOISE_KINDS))), rng.uniform(0, 1), rng.random()
    lo, hi = recipe.room_noise_dbfs
    noisy = chance < recipe.room_noise_probability
    return dataclasses.replace(u, room_noise=ROOM_NOISE_KINDS[kind] if noisy else "",
                               room_noise_dbfs=float(lo + level * (hi - lo)) if noisy else 0.0,
                               round_trip=bool(trip < recipe.round_trip_probability))


def room(rng: np.random.Generator, recipe: Recipe) -> dict[str, float]:
    """Utterance fields of an echo, a reverberation or neither (empty dict)."""
    kind = rng.random()
    if kind < recipe.echo_probability:
        return {"echo_delay": float(rng.uniform(*recipe.echo_delay)),
                "echo_feedback": float(rng.uniform(*recipe.echo_feedback))}
    if kind < recipe.echo_probability + recipe.reverb_probability:
        return {"rt60": float(rng.uniform(*recipe.rt60)),
                "direct_to_reverb_db": float(rng.uniform(*recipe.direct_to_reverb_db))}
    return {}


def espeak(text: str, voice: str, words_per_minute: int = 175, pitch: int = 50, word_gap: int = 0) -> np.ndarray:
    """espeak-ng's output: float32 [N] in [-1, 1] at ESPEAK_RATE (22.05 kHz)."""
    cmd = [require_espeak(), "-v", voice, "-s", str(words_per_minute), "-p", str(pitch), "-g", str(word_gap)]
    proc = subprocess.run(cmd + ["--stdout", text], capture_output=True, check=True)
    audio, rate = soundfile.read(io.BytesIO(proc.stdout), dtype="float32")
    if rate != ESPEAK_RATE:
        raise RuntimeError(f"espeak-ng wrote {rate} Hz audio, expected {ESPEAK_RATE}")
    return audio


def colored_noise(kind: str, n: int, dbfs: float, seed: int) -> np.ndarray:
    """White, pink (1/f power), brown (1/f^2), room or babble noise (ROOM_NOISE_KINDS): float32 [n] with an
    RMS of `dbfs` dB full scale."""
    rng = np.random.default_rng(seed)
    if kind == "babble":
        return _at_level(babble(n, rng), dbfs)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n), 1.0 / n)
    spectrum *= f ** -{"white": 0.0, "pink": 0.5, "brown": 1.0, "room": 0.5}[kind]
    if kind == "room":  # a second-order low-pass, in the spectrum: the noise is generated whole anyway
        spectrum /= 1 + (f * SAMPLE_RATE / ROOM_LOWPASS_HZ) ** 2
    noise = np.fft.irfft(spectrum, n)
    if kind == "room":
        noise = reverberate(noise.astype(np.float32), ROOM_RT60, 0.0, seed)
    return _at_level(noise, dbfs)


def babble(n: int, rng: np.random.Generator) -> np.ndarray:
    """BABBLE_TALKERS training voices saying random vocabulary backwards, each looped from a random point,
    in a diffuse room: float64 [n] at an arbitrary level."""
    out = np.zeros(n)
    for _ in range(BABBLE_TALKERS):
        words = " ".join(VOCABULARY[i] for i in rng.integers(len(VOCABULARY), size=BABBLE_WORDS))
        voice = f"{VOICE_BASES[rng.integers(len(VOICE_BASES))]}+{TRAIN_VARIANTS[rng.integers(1, len(TRAIN_VARIANTS))]}"
        talker = soxr.resample(espeak(words, voice, int(rng.integers(140, 220))), ESPEAK_RATE, SAMPLE_RATE)[::-1]
        talker = talker / (np.sqrt(np.mean(talker**2)) + 1e-12)
        out += np.roll(np.resize(talker, n), int(rng.integers(max(1, len(talker)))))
    return reverberate(out.astype(np.float32), ROOM_RT60, 0.0, int(rng.integers(2**31)))


def _at_level(noise: np.ndarray, dbfs: float) -> np.ndarray:
    noise = noise * (10 ** (dbfs / 20) / (np.sqrt(np.mean(noise**2)) + 1e-12))
    return np.clip(noise, -1.0, 1.0).astype(np.float32)


def render(u: Utterance) -> np.ndarray:
    """Synthesize and augment one utterance: float32 [N] in [-1, 1] at SAMPLE_RATE."""
    if not u.text:
        return colored_noise(u.noise_kind, int(u.noise_seconds * SAMPLE_RATE), u.noise_dbfs, u.noise_seed)
    raw = espeak(u.text, u.voice, u.words_per_minute, u.pitch, u.word_gap)
    # Reading 22.05 kHz samples as if they were (22.05 * speed) kHz plays them `speed` times faster.
    audio = soxr.resample(raw, ESPEAK_RATE * u.speed, SAMPLE_RATE).astype(np.float32)
    audio[1:] -= u.tilt * audio[:-1].copy()  # spectral tilt: a crude stand-in for microphones and vocal tracts
    lead, trail = int(u.lead * SAMPLE_RATE), int(u.trail * SAMPLE_RATE)
    audio = np.concatenate([np.zeros(lead, np.float32), audio, np.zeros(trail, np.float32)])
    if u.echo_delay > 0:  # echoes and reverberation ring on into the trailing silence
        audio = feedback_echo(audio, max(1, int(u.echo_delay * SAMPLE_RATE)), u.echo_feedback)
    if u.rt60 > 0:
        audio = reverberate(audio, u.rt60, u.direct_to_reverb_db, u.noise_seed)
    peak = float(np.abs(audio).max()) or 1.0
    audio *= np.float32(u.gain * 0.5 / peak)  # espeak-ng peaks near 0.5; gain is relative to that
    if u.snr_db is not None:
        speech_power = float(np.mean(audio[lead:len(audio) - trail] ** 2)) + 1e-12
        noise = np.random.default_rng(u.noise_seed).standard_normal(len(audio)).astype(np.float32)
        audio += noise * np.float32(np.sqrt(speech_power / 10 ** (u.snr_db / 10)))
    if u.room_noise:
        audio += colored_noise(u.room_noise, len(audio), u.room_noise_dbfs, u.noise_seed + 1)
    audio = np.clip(audio, -1.0, 1.0)
    return round_trip(audio) if u.round_trip else audio


def round_trip(audio: np.ndarray, rate: int = CLIENT_RATE) -> np.ndarray:
    """`audio` (float32 at SAMPLE_RATE) as a client at `rate` sends it (soxr, PCM16) and the server resamples
    it back (pipeline.audio.Resampler, as every door does): float32, the same length."""
    if rate == SAMPLE_RATE:
        return audio
    sent = np.clip(np.round(soxr.resample(audio, SAMPLE_RATE, rate) * 32768), -32768, 32767) / 32768
    back = Resampler(rate)
    out = np.concatenate([back.process(sent.astype(np.float32)), back.flush()])
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def feedback_echo(audio: np.ndarray, delay: int, feedback: float) -> np.ndarray:
    """y[n] = x[n] + feedback * y[n - delay], a block of `delay` samples at a time."""
    out = audio.copy()
    for start in range(delay, len(out), delay):
        end = min(start + delay, len(out))
        out[start:end] += feedback * out[start - delay : end - delay]
    return out


def reverberate(audio: np.ndarray, rt60: float, direct_to_reverb_db: float, seed: int) -> np.ndarray:
    """Convolution with a synthetic room response: the direct sound, then exponentially decaying noise.
    The result keeps the input's length (the tail falls into the trailing silence or is cut)."""
    rng = np.random.default_rng([seed, 1])
    t = np.arange(1, int(rt60 * SAMPLE_RATE)) / SAMPLE_RATE
    tail = rng.standard_normal(len(t)) * np.exp(-6.9 * t / rt60)  # 60 dB = e^-6.9 in amplitude
    tail *= 10 ** (-direct_to_reverb_db / 20) / (np.sqrt(np.sum(tail**2)) + 1e-12)
    response = np.concatenate([[1.0], tail])
    n = len(audio) + len(response) - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(response, size), size)[: len(audio)]
    return wet.astype(np.float32)


def text_seed(text: str) -> int:
    """A stable per-text number (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode("utf-8"))
