// Audio thread of the Unipad page: resample the microphone to 16 kHz, quantise to s16le and post ~100 ms
// frames (plus a level) to the page. Loaded by audioWorklet.addModule; also loadable as a plain <script>
// (the tests use that to check the resampler), where it only defines UnipadResampler.
"use strict";

const TARGET_RATE = 16000; // pipeline/audio.py SAMPLE_RATE: what the model hears
const FRAME_SAMPLES = 1600; // 100 ms at TARGET_RATE per binary frame
const ZERO_CROSSINGS = 16; // sinc lobes on each side of the kernel centre: ~90 dB stop band with Blackman
const PASS_FRACTION = 0.9; // cutoff at 90% of the output Nyquist (7.2 kHz), transition band above it
const MAX_TABLE_PHASES = 4096; // polyphase table for rational ratios up to this many phases

function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

// Streaming windowed-sinc resampler (band-limited interpolation). For output sample n the input position
// is n * inRate / outRate = i + phase/M with L/M the reduced ratio; the output is the sum of the inputs
// around it weighted by a Blackman-windowed sinc whose cutoff is below both Nyquist frequencies, so
// downsampling 48 kHz to 16 kHz removes everything above ~7.2 kHz before it can alias.
class UnipadResampler {
  constructor(inRate, outRate = TARGET_RATE) {
    const g = gcd(inRate, outRate);
    this.L = inRate / g; // input steps per M outputs
    this.M = outRate / g; // phases
    const ratio = outRate / inRate;
    this.fc = 0.5 * Math.min(1, ratio) * PASS_FRACTION; // cutoff, cycles per input sample
    this.half = Math.ceil(ZERO_CROSSINGS / (2 * this.fc)); // taps on each side, in input samples
    this.gain = 2 * this.fc;
    this.table = this.M <= MAX_TABLE_PHASES ? this.buildTable() : null;
    // Pre-fill with silence so the first output is centred on the first input sample.
    this.buffer = new Float32Array(4096);
    this.length = this.half;
    this.index = this.half; // buffer index of the input sample at or before the next output (i)
    this.phase = 0; // fractional position of the next output: phase / M input samples after `index`
  }

  kernel(distance) {
    // distance: input samples from the output position; windowed sinc, zero outside +-half.
    const x = Math.abs(distance);
    if (x >= this.half) return 0;
    const w = 0.42 + 0.5 * Math.cos((Math.PI * x) / this.half) + 0.08 * Math.cos((2 * Math.PI * x) / this.half);
    const arg = Math.PI * 2 * this.fc * distance;
    return this.gain * w * (arg === 0 ? 1 : Math.sin(arg) / arg);
  }

  buildTable() {
    // table[p * taps + k] weights input index - half + 1 + k for phase p.
    const taps = 2 * this.half;
    const table = new Float32Array(this.M * taps);
    for (let p = 0; p < this.M; p++) {
      const frac = p / this.M;
      let sum = 0;
      for (let k = 0; k < taps; k++) sum += (table[p * taps + k] = this.kernel(k - this.half + 1 - frac));
      for (let k = 0; k < taps; k++) table[p * taps + k] /= sum; // exact unity gain at DC for every phase
    }
    return table;
  }

  // Append input samples (Float32Array); return the output samples now computable (Float32Array).
  process(input) {
    if (this.length + input.length > this.buffer.length) {
      const grown = new Float32Array(Math.max(this.buffer.length * 2, this.length + input.length));
      grown.set(this.buffer.subarray(0, this.length));
      this.buffer = grown;
    }
    this.buffer.set(input, this.length);
    this.length += input.length;
    const taps = 2 * this.half;
    const out = [];
    const buf = this.buffer;
    // Output needs inputs index - half + 1 .. index + half.
    while (this.index + this.half < this.length) {
      const first = this.index - this.half + 1;
      let acc = 0;
      if (this.table) {
        const row = this.phase * taps;
        for (let k = 0; k < taps; k++) acc += buf[first + k] * this.table[row + k];
      } else {
        const frac = this.phase / this.M;
        for (let k = 0; k < taps; k++) acc += buf[first + k] * this.kernel(k - this.half + 1 - frac);
      }
      out.push(acc);
      this.phase += this.L;
      this.index += Math.floor(this.phase / this.M);
      this.phase %= this.M;
    }
    // Drop the inputs no future output needs.
    const keep = this.index - this.half + 1;
    if (keep > 0) {
      buf.copyWithin(0, keep, this.length);
      this.length -= keep;
      this.index -= keep;
    }
    return Float32Array.from(out);
  }
}

globalThis.UnipadResampler = UnipadResampler;

if (typeof AudioWorkletProcessor !== "undefined") {
  class UnipadCapture extends AudioWorkletProcessor {
    constructor() {
      super();
      this.resampler = new UnipadResampler(sampleRate, TARGET_RATE); // sampleRate: the context's, a worklet global
      this.frame = new Int16Array(FRAME_SAMPLES);
      this.filled = 0;
      this.peak = 0;
      this.sumSquares = 0;
      this.levelSamples = 0;
      this.port.onmessage = (event) => {
        if (event.data === "flush") this.flush();
      };
    }

    flush() {
      // The samples of the unfinished frame, marked last: the page sends them, then `stop`.
      const pcm = this.frame.slice(0, this.filled);
      this.filled = 0;
      this.port.postMessage({ pcm: pcm.buffer, last: true }, [pcm.buffer]);
    }

    process(inputs) {
      const channels = inputs[0];
      if (!channels || channels.length === 0) return true; // no input connected yet
      // Downmix: mean of the channels.
      let mono = channels[0];
      if (channels.length > 1) {
        mono = new Float32Array(mono.length);
        for (const ch of channels) for (let i = 0; i < ch.length; i++) mono[i] += ch[i] / channels.length;
      }
      for (let i = 0; i < mono.length; i++) {
        const v = Math.abs(mono[i]);
        if (v > this.peak) this.peak = v;
        this.sumSquares += mono[i] * mono[i];
      }
      this.levelSamples += mono.length;
      for (const s of this.resampler.process(mono)) {
        const clipped = Math.max(-1, Math.min(1, s));
        this.frame[this.filled++] = clipped < 0 ? Math.round(clipped * 32768) : Math.round(clipped * 32767);
        if (this.filled === FRAME_SAMPLES) {
          const pcm = this.frame;
          this.frame = new Int16Array(FRAME_SAMPLES);
          this.filled = 0;
          const rms = Math.sqrt(this.sumSquares / Math.max(1, this.levelSamples));
          this.port.postMessage({ pcm: pcm.buffer, rms, peak: this.peak }, [pcm.buffer]);
          this.peak = 0;
          this.sumSquares = 0;
          this.levelSamples = 0;
        }
      }
      return true;
    }
  }
  registerProcessor("unipad-capture", UnipadCapture);
}
