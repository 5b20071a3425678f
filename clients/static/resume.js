// Resumable streams for the page (docs/protocol.md, "Resuming a stream"): the audio sent that no final
// covers yet, bounded, and where a resume starts. The same rules as clients/resume.py's Backlog.
"use strict";

const VAD_FRAME_SECONDS = 0.03; // pipeline/segmenter.py FRAME_SECONDS: resume times lie on this grid
const RESUMABLE_ERRORS = ["overloaded", "internal_error"]; // the stream may go on on another server
const FATAL_CLOSES = [1003, 1007, 1008, 1009]; // the client was wrong: resuming would repeat it
// As clients/resume.py's ResumeOptions: a lost connection is tried again for as long as the audio kept
// lasts (keepSeconds from the loss), however many attempts that takes. A page embedding this may change them
// before it starts a stream (window.unipad.resumeOptions).
const resumeOptions = {
  backoffMs: 200, // the second attempt's delay, doubling per attempt up to maxBackoffMs, with jitter
  maxBackoffMs: 5000,
  keepSeconds: 60, // audio kept past the last final: a 30 s segment plus a margin for the server's lag
};

class UnipadBacklog {
  constructor(sampleRate, frameBytes, keepSeconds = resumeOptions.keepSeconds) {
    this.rate = sampleRate;
    this.frameBytes = frameBytes;
    this.keepFrames = Math.floor(keepSeconds * sampleRate);
    this.chunks = []; // [first sample, ArrayBuffer]
    this.sent = 0; // sample frames in the whole stream
    this.resumeTime = 0;
    this.nextSegment = 0;
  }

  add(pcm) {
    this.chunks.push([this.sent, pcm]);
    this.sent += pcm.byteLength / this.frameBytes;
    while (this.chunks.length && this.sent - this.startSample() > this.keepFrames) {
      const next = this.chunks.length > 1 ? this.chunks[1][0] : this.sent;
      this.advance(Math.ceil(next / this.rate / VAD_FRAME_SECONDS - 1e-9) * VAD_FRAME_SECONDS);
    }
  }

  // A final (end: seconds) or a segment's error (end: null) arrived.
  cover(segment, end) {
    this.nextSegment = Math.max(this.nextSegment, segment + 1);
    if (end != null) this.advance(Math.round(end / VAD_FRAME_SECONDS) * VAD_FRAME_SECONDS);
  }

  resume(session) {
    return { session, segment: this.nextSegment, time: Math.round(this.resumeTime * 1e6) / 1e6 };
  }

  pending() {
    const first = this.startSample();
    const out = [];
    for (const [start, pcm] of this.chunks) {
      const skip = Math.max(0, first - start) * this.frameBytes;
      if (skip < pcm.byteLength) out.push(skip ? pcm.slice(skip) : pcm);
    }
    return out;
  }

  startSample() {
    return Math.floor(this.resumeTime * this.rate + 1e-6);
  }

  advance(time) {
    if (time <= this.resumeTime) return; // never backwards
    this.resumeTime = time;
    const first = this.startSample();
    while (this.chunks.length && this.chunks[0][0] + this.chunks[0][1].byteLength / this.frameBytes <= first) {
      this.chunks.shift();
    }
  }
}

// The wait before the attempt-th attempt (1: at once), never past the deadline (ms since the epoch).
function resumeDelayMs(attempt, deadline) {
  if (attempt <= 1) return 0;
  const delay = Math.min(resumeOptions.maxBackoffMs, resumeOptions.backoffMs * 2 ** (attempt - 2));
  return Math.min(delay / 2 + Math.random() * delay / 2, Math.max(0, deadline - Date.now()));
}
