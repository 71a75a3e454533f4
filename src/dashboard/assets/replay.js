// Run replay: a run's steps (run.replay) played back over the frames the bot saw, each click, drag, scroll and key drawn where it happened, and people's control sessions in the same order (with their screen recordings, where the server records them); step by step or as a timeline.
import { el, rpc } from "./app.js";

/** How long each step shows when playing. */
const STEP_MS = 1200;
/** The longest a control session's recorded frame shows when its recording plays. */
const SESSION_FRAME_MS = 1000;
/** Colours of the marks: the bot's actions, a person's session. */
const BOT = "#e4572e", USER = "#2e86de";

function when(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function seconds(ms) { return `${Math.max(0, Math.round(ms / 100) / 10)} s`; }

/** One line saying what a step did. */
function describe(step) {
  if (step.kind === "control.session") {
    const s = step.session || {}, n = s.inputs || {};
    return `person in control for ${seconds(s.durationMs || 0)}: ${n.clicks || 0} clicks, ${n.keys || 0} keys, ${n.scrolls || 0} scrolls, ${n.pointerMoves || 0} moves`;
  }
  if (step.tool === "computer_observe") return "looked at the screen";
  const acts = (step.actions || []).map((a) => {
    switch (a.type) {
      case "click": return `${a.double ? "double-" : ""}click ${a.x},${a.y}`;
      case "move": return `move ${a.x},${a.y}`;
      case "drag": return `drag ${a.from_x},${a.from_y} → ${a.to_x},${a.to_y}`;
      case "scroll": return `scroll ${a.dx},${a.dy} at ${a.x},${a.y}`;
      case "type": return `type “${a.text}”`;
      case "key": return `key ${a.keys}`;
      case "wait": return `wait ${a.ms} ms`;
      default: return a.type;
    }
  });
  const r = step.result || {};
  const done = r.total !== undefined ? ` (${r.completed}/${r.total})` : "";
  return acts.join(", ") + done;
}

/** The marks of an action batch: [{kind, x, y, ...}] in screen pixels. */
function marks(step) {
  const out = [];
  let at = null;
  (step.actions || []).forEach((a, i) => {
    const n = i + 1;
    if (a.type === "click" || a.type === "move") { at = { x: a.x, y: a.y }; out.push({ kind: a.type, n, ...at }); }
    else if (a.type === "drag") { out.push({ kind: "drag", n, x: a.from_x, y: a.from_y, x2: a.to_x, y2: a.to_y }); at = { x: a.to_x, y: a.to_y }; }
    else if (a.type === "scroll") { at = { x: a.x, y: a.y }; out.push({ kind: "scroll", n, ...at, dx: a.dx, dy: a.dy }); }
    else if (a.type === "type" || a.type === "key") out.push({ kind: a.type, n, label: a.type === "type" ? a.text : a.keys, ...(at || { x: 24, y: 40 }) });
  });
  return out;
}

function draw(ctx, m) {
  ctx.save();
  ctx.lineWidth = 4;
  ctx.strokeStyle = BOT;
  ctx.fillStyle = BOT;
  ctx.font = "bold 22px sans-serif";
  if (m.kind === "click" || m.kind === "move") {
    ctx.beginPath();
    ctx.arc(m.x, m.y, m.kind === "click" ? 18 : 8, 0, Math.PI * 2);
    ctx.stroke();
    if (m.kind === "click") { ctx.beginPath(); ctx.arc(m.x, m.y, 5, 0, Math.PI * 2); ctx.fill(); }
    ctx.fillText(String(m.n), m.x + 22, m.y - 14);
  } else if (m.kind === "drag") {
    ctx.beginPath(); ctx.moveTo(m.x, m.y); ctx.lineTo(m.x2, m.y2); ctx.stroke();
    ctx.beginPath(); ctx.arc(m.x2, m.y2, 8, 0, Math.PI * 2); ctx.fill();
    ctx.fillText(String(m.n), m.x + 12, m.y - 12);
  } else if (m.kind === "scroll") {
    ctx.beginPath(); ctx.moveTo(m.x, m.y); ctx.lineTo(m.x + Math.sign(m.dx) * 40, m.y + Math.sign(m.dy) * 40); ctx.stroke();
    ctx.fillText(`${m.n} ⇕`, m.x + 12, m.y - 12);
  } else {
    const text = `${m.n} ${m.kind === "type" ? "⌨ " : "⌘ "}${m.label}`;
    const w = ctx.measureText(text).width + 16;
    ctx.fillStyle = "rgba(20,20,20,0.85)";
    ctx.fillRect(m.x + 24, m.y + 8, w, 34);
    ctx.fillStyle = "#fff";
    ctx.fillText(text, m.x + 32, m.y + 33);
  }
  ctx.restore();
}

/** The player of one run. */
export class Replay {
  constructor(runId) {
    this.runId = runId;
    this.index = 0;
    this.images = new Map();
    this.canvas = el("canvas", { "data-role": "replay-frame", width: 1280, height: 800 });
    this.caption = el("p", { class: "replay-caption", "data-role": "replay-caption" });
    this.list = el("ol", { class: "replay-steps" });
    this.prevBtn = el("button", { "data-action": "replay-prev", onclick: () => this.show(this.index - 1) }, "◀ Step");
    this.nextBtn = el("button", { "data-action": "replay-next", onclick: () => this.show(this.index + 1) }, "Step ▶");
    this.playBtn = el("button", { class: "primary", "data-action": "replay-play", onclick: () => this.toggle() }, "Play");
    this.sessionBtn = el("button", { "data-action": "replay-session", hidden: true, onclick: () => this.playSession() }, "Play recorded screen");
    this.root = el("section", { class: "replay", "data-role": "replay", "data-run": runId },
      el("div", { class: "replay-bar" }, this.prevBtn, this.playBtn, this.nextBtn, this.sessionBtn),
      el("div", { class: "replay-body" }, el("div", { class: "replay-stage" }, this.canvas, this.caption), this.list));
  }

  async load() {
    const r = await rpc("run.replay", { runId: this.runId });
    this.steps = r.steps;
    this.list.replaceChildren(...this.steps.map((s, i) =>
      el("li", { "data-replay-step": String(i), "data-actor": s.actor, class: s.actor, onclick: () => this.show(i) },
        el("span", { class: "when" }, `${when(s.atMs)} · ${s.actor}`), " ", describe(s))));
    this.root.dataset.steps = String(this.steps.length);
    this.root.dataset.ready = "true";
    if (this.steps.length) await this.show(0);
    else this.caption.textContent = "Nothing was recorded for this run.";
  }

  /** The frame a step is drawn over: what the bot saw before it acted (the step's own frame for an observation). */
  frameFor(i) {
    const own = this.steps[i];
    if (own.tool === "computer_observe" && own.frame) return own.frame;
    for (let j = i - 1; j >= 0; j--) if (this.steps[j].frame) return this.steps[j].frame;
    return own.frame || null;
  }

  /** A frame's image, fetched once: a run's frame, or one of a control session's recording. */
  async image(frame, recordingId) {
    const key = `${recordingId || this.runId}:${frame.digest}`;
    if (!this.images.has(key)) {
      const got = recordingId
        ? rpc("control.replayFrame", { recordingId, digest: frame.digest })
        : rpc("run.replayFrame", { runId: this.runId, digest: frame.digest });
      this.images.set(key, got.then((f) =>
        new Promise((resolve, reject) => {
          const img = new Image();
          img.onload = () => resolve(img);
          img.onerror = () => reject(new Error("frame"));
          img.src = `data:${f.mimeType};base64,${f.data}`;
        })));
    }
    return this.images.get(key);
  }

  /** The frames of a control session's screen recording (control.replay), fetched once. */
  async sessionFrames(recordingId) {
    this.sessions = this.sessions || new Map();
    if (!this.sessions.has(recordingId)) this.sessions.set(recordingId, rpc("control.replay", { recordingId }).then((r) => r.frames));
    return this.sessions.get(recordingId);
  }

  /** Draws a frame image over the whole canvas. */
  paint(img) {
    this.canvas.width = img.naturalWidth;
    this.canvas.height = img.naturalHeight;
    this.canvas.getContext("2d").drawImage(img, 0, 0);
  }

  /** Plays the recording of the control session shown, frame by frame at its own pace. */
  async playSession() {
    const i = this.index, step = this.steps[i], id = step.session?.recording?.id;
    if (!id) return;
    const frames = await this.sessionFrames(id);
    for (let k = 0; k < frames.length; k++) {
      if (this.index !== i) return;
      this.paint(await this.image(frames[k], id));
      this.root.dataset.sessionFrame = String(k);
      this.caption.textContent = `Step ${i + 1} of ${this.steps.length} · ${step.actor} · recorded screen ${k + 1} of ${frames.length}`;
      const next = frames[k + 1];
      if (next) await new Promise((r) => setTimeout(r, Math.min(SESSION_FRAME_MS, Math.max(0, next.atMs - frames[k].atMs))));
    }
  }

  async show(i) {
    if (!this.steps || i < 0 || i >= this.steps.length) return;
    this.index = i;
    const step = this.steps[i];
    for (const li of this.list.children) li.setAttribute("aria-current", String(li.dataset.replayStep === String(i)));
    const recording = step.kind === "control.session" ? step.session?.recording : null;
    const recorded = recording?.id && recording.frames ? await this.sessionFrames(recording.id) : [];
    if (this.index !== i) return;
    this.sessionBtn.hidden = !recorded.length;
    this.root.dataset.sessionFrames = String(recorded.length);
    delete this.root.dataset.sessionFrame;
    const frame = recorded.length ? recorded[0] : this.frameFor(i);
    const ctx = this.canvas.getContext("2d");
    if (frame) {
      const img = await this.image(frame, recorded.length ? recording.id : undefined);
      if (this.index !== i) return;
      this.paint(img);
    } else {
      ctx.fillStyle = "#222";
      ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
    }
    let drawn = 0;
    if (step.kind === "control.session") {
      ctx.fillStyle = "rgba(46,134,222,0.18)";
      ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
      ctx.strokeStyle = USER;
      ctx.lineWidth = 10;
      ctx.strokeRect(5, 5, this.canvas.width - 10, this.canvas.height - 10);
      drawn = 1;
    } else {
      // A scaled-down screenshot: the marks are in screen pixels.
      const scale = step.result?.scale || 1;
      ctx.save();
      ctx.scale(scale, scale);
      for (const m of marks(step)) { draw(ctx, m); drawn++; }
      ctx.restore();
    }
    this.root.dataset.step = String(i);
    this.root.dataset.actor = step.actor;
    this.root.dataset.marks = String(drawn);
    this.caption.textContent = `Step ${i + 1} of ${this.steps.length} · ${step.actor} · ${describe(step)}`;
    this.prevBtn.disabled = i === 0;
    this.nextBtn.disabled = i === this.steps.length - 1;
  }

  toggle() {
    if (this.timer) { clearInterval(this.timer); this.timer = null; this.playBtn.textContent = "Play"; return; }
    this.playBtn.textContent = "Pause";
    if (this.index >= this.steps.length - 1) this.show(0);
    this.timer = setInterval(() => {
      if (this.index >= this.steps.length - 1) return this.toggle();
      this.show(this.index + 1);
    }, STEP_MS);
  }

  close() { if (this.timer) clearInterval(this.timer); this.root.remove(); }
}

/** Open a run's replay over the page. */
export async function openReplay(runId) {
  document.querySelector("[data-role=replay-dialog]")?.remove();
  const player = new Replay(runId);
  const dialog = el("div", { class: "replay-dialog", "data-role": "replay-dialog" },
    el("div", { class: "replay-head" }, el("h3", {}, "Run replay"),
      el("button", { class: "link", "data-action": "replay-close", onclick: () => { player.close(); dialog.remove(); if (location.hash.startsWith("#replay=")) history.replaceState(null, "", location.pathname); } }, "Close")),
    player.root);
  document.body.append(dialog);
  try { await player.load(); } catch (e) { player.caption.textContent = e.message; player.root.dataset.error = e.code || "INTERNAL"; }
  return player;
}

/** `#replay=<run id>` opens that run's replay. */
export function openFromHash() {
  const m = location.hash.match(/^#replay=([A-Za-z0-9-]+)$/);
  if (m) openReplay(m[1]);
}
