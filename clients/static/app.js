// The Unipad page: microphone -> AudioWorklet (resampled to 16 kHz s16le, worklet.js) -> WebSocket ->
// partials replaced in place, finals appended with their times. Wire messages: server/protocol.py.
"use strict";

// server/protocol.py STREAM_PATH, resolved against the page so a reverse proxy's path prefix still works.
const STREAM_PATH = "v1/stream";
const TARGET_RATE = 16000; // the worklet's output rate (pipeline/audio.py SAMPLE_RATE)
const STOP_TIMEOUT_MS = 60000; // the last final of a 30 s segment on a slow CPU
const CLOSE_REASONS = {
  1001: "the server is shutting down",
  1003: "unsupported audio",
  1006: "the connection was lost",
  1007: "invalid data",
  1008: "refused by policy (token, origin or protocol)",
  1009: "message too big",
  1011: "server error",
  1013: "the server is overloaded; try again later",
};

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("controls"), start: $("start"), stop: $("stop"), token: $("token"), language: $("language"),
  itn: $("itn"), hotwords: $("hotwords"), state: $("state"), level: $("level"), levelBar: $("level-bar"),
  errors: $("errors"),
  finals: $("finals"), partial: $("partial"), empty: $("empty"), session: $("session"),
};

let current = null; // the running session: {ws, media, context, node, ready, done, backlog, stopTimer}
const stats = { partials: 0, finals: 0, errors: 0, done: 0, maxLevel: 0, resumes: 0 }; // counts since load, for tests

function streamUrl(token) {
  const override = new URLSearchParams(location.search).get("server"); // ?server=wss://host/v1/stream
  const url = new URL(override || STREAM_PATH, document.baseURI);
  if (url.protocol === "https:") url.protocol = "wss:";
  if (url.protocol === "http:") url.protocol = "ws:";
  if (token) url.searchParams.set("token", token);
  return url.href;
}

function setState(state, text) {
  ui.state.dataset.state = state;
  ui.state.textContent = text;
  const busy = state === "connecting" || state === "listening" || state === "stopping";
  ui.start.disabled = busy;
  ui.stop.disabled = !(state === "connecting" || state === "listening");
  for (const el of [ui.token, ui.language, ui.itn, ui.hotwords]) el.disabled = busy;
}

function showError(text) {
  const item = document.createElement("p");
  item.className = "error";
  item.textContent = text;
  ui.errors.append(item);
  stats.errors += 1;
}

function formatTime(seconds) {
  const minutes = Math.floor(seconds / 60);
  const rest = (seconds - minutes * 60).toFixed(1).padStart(4, "0");
  return `${minutes}:${rest}`;
}

function setLevel(rms) {
  // -60 dBFS .. 0 dBFS onto 0 .. 100
  const db = 20 * Math.log10(Math.max(rms, 1e-6));
  const value = Math.round(Math.max(0, Math.min(100, ((db + 60) / 60) * 100)));
  ui.levelBar.style.width = `${value}%`;
  ui.level.setAttribute("aria-valuenow", String(value));
  stats.maxLevel = Math.max(stats.maxLevel, value);
  ui.level.setAttribute("aria-valuetext", rms > 0 ? `${Math.round(db)} dB` : "silent");
}

function onServerMessage(session, text) {
  let msg;
  try {
    msg = JSON.parse(text);
  } catch (err) {
    showError(`Bad message from the server: ${String(text).slice(0, 200)}`);
    return;
  }
  switch (msg.type) {
    case "ready":
      session.ready = true;
      session.attempts = 0;
      if (!session.stream) { // a resumed connection keeps the stream's first session id
        session.stream = msg.session;
        ui.session.textContent = `Session ${msg.session} · model ${msg.model} · ${msg.provider}`;
      }
      if (!session.stopRequested) setState("listening", "Listening");
      // The audio captured while connecting, or on a resume what no final covers yet (resume.js).
      for (const pcm of session.backlog.pending()) session.ws.send(pcm);
      if (session.stopRequested && !session.media) sendStop(session);
      break;
    case "partial":
      stats.partials += 1;
      ui.partial.textContent = msg.text;
      ui.partial.dataset.segment = msg.segment;
      ui.empty.hidden = true;
      break;
    case "final": {
      stats.finals += 1;
      session.backlog.cover(msg.segment, msg.end);
      if (Number(ui.partial.dataset.segment) <= msg.segment) {
        ui.partial.textContent = "";
        delete ui.partial.dataset.segment;
      }
      if (!msg.text) break; // a segment that held no words
      const item = document.createElement("li");
      item.dataset.segment = msg.segment;
      const time = document.createElement("span");
      time.className = "time";
      time.textContent = `${formatTime(msg.start)}–${formatTime(msg.end)}`;
      const words = document.createElement("span");
      words.className = "text";
      words.textContent = msg.text;
      item.append(time, words);
      ui.finals.append(item);
      ui.empty.hidden = true;
      item.scrollIntoView({ block: "nearest" });
      break;
    }
    case "error":
      if (msg.segment != null) session.backlog.cover(msg.segment, null);
      else if (RESUMABLE_ERRORS.includes(msg.code)) { session.retry = true; break; } // resumed on close
      showError(`Server error ${msg.code}: ${msg.message}` + (msg.segment != null ? ` (segment ${msg.segment})` : ""));
      break;
    case "done":
      session.done = true;
      stats.done += 1;
      session.ws.close(1000);
      break;
    default:
      break; // a message type this page does not know
  }
}

function releaseAudio(session) {
  if (session.media) for (const track of session.media.getTracks()) track.stop();
  if (session.context && session.context.state !== "closed") session.context.close();
  session.media = session.context = session.node = null;
  setLevel(0);
}

function sendStop(session) {
  if (session.stopSent || session.ws.readyState !== WebSocket.OPEN) return;
  session.stopSent = true;
  session.ws.send(JSON.stringify({ type: "stop" }));
  session.stopTimer = setTimeout(() => {
    showError("No answer from the server after stop; closing.");
    session.abandoned = true;
    session.ws.close(1000);
  }, STOP_TIMEOUT_MS);
}

function onAudioFrame(session, data) {
  if (data.rms !== undefined) setLevel(data.rms);
  if (session.stopRequested && !data.last) return; // frames after Stop are not sent
  const pcm = data.pcm;
  if (pcm && pcm.byteLength > 0) {
    session.backlog.add(pcm); // kept until a final covers it: a resume re-sends it (resume.js)
    if (session.ready && session.ws.readyState === WebSocket.OPEN) session.ws.send(pcm);
  }
  if (data.last) {
    releaseAudio(session);
    if (session.ready) sendStop(session);
  }
}

// An error whose message says it all (no "TypeError: ..." prefix); `server`: the server, not the microphone.
function pageError(message, server = false) {
  return Object.assign(new Error(message), { name: "", server });
}

async function startAudio(session) {
  if (!navigator.mediaDevices) { // browsers hide it outside secure contexts
    throw pageError(`browsers offer the microphone only to https:// pages and http://localhost, not to ${location.origin}: ` +
                    "serve TLS (--certfile/--keyfile, or a reverse proxy), or open the page through localhost");
  }
  session.media = await navigator.mediaDevices.getUserMedia({
    // Unprocessed audio: the model was trained on it, and gain pumping or echo suppression mangle words.
    audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
  });
  session.context = new AudioContext();
  try {
    await session.context.audioWorklet.addModule("static/worklet.js");
  } catch (err) { // fetched from the server on Start: this is where a stopped server shows first
    throw pageError(`could not load ${new URL("static/worklet.js", document.baseURI)}: is the server running?`, true);
  }
  const source = session.context.createMediaStreamSource(session.media);
  session.node = new AudioWorkletNode(session.context, "unipad-capture", {
    numberOfInputs: 1, numberOfOutputs: 1, channelCount: 1, channelCountMode: "explicit",
  });
  session.node.port.onmessage = (event) => onAudioFrame(session, event.data);
  // A silent path to the destination keeps the graph pulling the worklet in every browser.
  const mute = session.context.createGain();
  mute.gain.value = 0;
  source.connect(session.node).connect(mute).connect(session.context.destination);
  if (session.context.state === "suspended") await session.context.resume();
}

// "save, turn on:2.5" -> ["save", {text: "turn on", boost: 2.5}]; the server checks them (bad_start).
function parseHotwords(value) {
  return value.split(",").map((s) => s.trim()).filter(Boolean).map((item) => {
    const match = /^(.+):\s*(\d+(?:\.\d+)?)$/.exec(item);
    return match ? { text: match[1].trim(), boost: Number(match[2]) } : item;
  });
}

async function start() {
  ui.errors.replaceChildren();
  setState("connecting", "Connecting…");
  const token = ui.token.value.trim();
  const url = streamUrl(token);
  const session = { ws: null, ready: false, done: false, opened: false, stopRequested: false,
                    stopSent: false, stopTimer: null, media: null, context: null, node: null,
                    backlog: new UnipadBacklog(TARGET_RATE, 2), stream: null, attempts: 0, retry: false,
                    abandoned: false };
  current = session;
  try {
    await startAudio(session);
  } catch (err) {
    releaseAudio(session);
    const what = err.server ? "Server unreachable" : "Microphone unavailable";
    showError(`${what}: ${err.name ? `${err.name}: ` : ""}${err.message}`);
    setState("error", what);
    current = null;
    return;
  }
  if (session.stopRequested) { // Stop pressed while the microphone was opening
    releaseAudio(session);
    setState("idle", "Idle");
    current = null;
    return;
  }
  openSocket(session, url, token);
}

function openSocket(session, url, token) {
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  session.ws = ws;
  ws.onopen = () => {
    session.opened = true;
    const startMessage = { type: "start", sample_rate: TARGET_RATE, format: "s16le", channels: 1,
                           language: ui.language.value, itn: ui.itn.checked, partials: true, resumable: true };
    if (token) startMessage.token = token;
    const hotwords = parseHotwords(ui.hotwords.value);
    if (hotwords.length) startMessage.hotwords = hotwords;
    if (session.stream) startMessage.resume = session.backlog.resume(session.stream);
    ws.send(JSON.stringify(startMessage));
  };
  ws.onmessage = (event) => {
    if (typeof event.data === "string") onServerMessage(session, event.data);
  };
  ws.onclose = (event) => onClose(session, event, url, token);
}

// A server that drains (1001), fails or vanishes: the stream goes on through another connection.
function resumeOnClose(session, event, url, token) {
  const resumable = session.retry || (session.stream && !FATAL_CLOSES.includes(event.code));
  if (session.done || session.abandoned || !resumable || current !== session) return false;
  if (session.attempts === 0) session.resumeDeadline = Date.now() + resumeOptions.keepSeconds * 1000;
  else if (Date.now() >= session.resumeDeadline) return false; // the audio kept since the loss is spent
  session.attempts += 1;
  session.ready = session.stopSent = session.retry = false;
  stats.resumes += 1;
  if (session.stopRequested) setState("stopping", "Finishing… (reconnecting)");
  else setState("connecting", "Reconnecting…");
  setTimeout(() => openSocket(session, url, token), resumeDelayMs(session.attempts, session.resumeDeadline));
  return true;
}

function onClose(session, event, url, token) {
  clearTimeout(session.stopTimer);
  if (resumeOnClose(session, event, url, token)) return;
  releaseAudio(session);
  const clean = session.done && (event.code === 1000 || event.code === 1005);
  if (!clean) {
    const known = CLOSE_REASONS[event.code];
    const reason = event.reason || known || "";
    const where = url.replace(/([?&])token=[^&]*/, "$1token=…");
    const text = session.opened
      ? `Connection closed (code ${event.code}${reason ? `: ${reason}` : ""})`
      : `Could not connect to ${where} (code ${event.code}; server down, wrong address, or token refused)`;
    showError(text);
  }
  if (current === session) current = null;
  setState(clean ? "idle" : "error", clean ? "Idle" : "Disconnected");
}

function stop() {
  const session = current;
  if (!session || session.stopRequested) return;
  session.stopRequested = true;
  setState("stopping", "Finishing…");
  if (!session.ws) return; // the microphone is still opening: start() sees stopRequested
  if (session.node) session.node.port.postMessage("flush"); // answered by a frame with `last: true`
  else if (session.ready) sendStop(session);
}

ui.form.addEventListener("submit", (event) => {
  event.preventDefault();
  start();
});
ui.stop.addEventListener("click", stop);
setState("idle", "Idle");
setLevel(0);

window.unipad = { streamUrl, formatTime, stats, resumeOptions }; // for the tests, the console and embedders
