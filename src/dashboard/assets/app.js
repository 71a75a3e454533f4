// The dashboard's state and clients: sign-in, JSON-RPC calls over POST /rpc, live events over /rpc/ws, the space view.
import { Screen } from "./screen.js";
import { Dock } from "./dock.js";
import { Activity } from "./activity.js";
import { Maintenance } from "./maintenance.js";
import { openReplay, openFromHash } from "./replay.js";

const TOKEN_KEY = "rakazo.token";
const $ = (id) => document.getElementById(id);

/** Shared state: the token, who we are, the open space and the bot views in it. */
export const state = { token: sessionStorage.getItem(TOKEN_KEY) || "", userId: null, isOperator: false, spaceId: null, space: null, bots: new Map(), computers: new Map() };

/** An RPC error with its stable code (`error.data.code`) and the server's message. */
export class RpcError extends Error {
  constructor(code, message, status) { super(message); this.code = code; this.status = status; }
}

let seq = 0;
/** One JSON-RPC call over HTTP as the signed-in user. */
export async function rpc(method, params = {}) {
  let resp;
  try {
    resp = await fetch("/rpc", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${state.token}` },
      body: JSON.stringify({ jsonrpc: "2.0", id: ++seq, method, params }),
    });
  } catch (e) {
    throw new RpcError("OFFLINE", "The server cannot be reached.", 0);
  }
  let body = null;
  try { body = await resp.json(); } catch (e) { /* not JSON */ }
  if (!body) throw new RpcError("INTERNAL", `The server answered ${resp.status}.`, resp.status);
  if (body.error) throw new RpcError(body.error.data?.code || "INTERNAL", body.error.message, resp.status);
  return body.result;
}

/** Build an element: el("div", {class: "x"}, child, "text"). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c);
  return node;
}

// ---- live events ---------------------------------------------------------------------------

let ws = null, wsSeq = 0, backoff = 500;
const pending = new Map();

function wsCall(method, params) {
  return new Promise((resolve, reject) => {
    if (!ws || ws.readyState !== WebSocket.OPEN) return reject(new RpcError("OFFLINE", "not connected", 0));
    const id = ++wsSeq;
    pending.set(id, { resolve, reject });
    ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
  });
}

function setLive(on) {
  $("live").dataset.state = on ? "live" : "offline";
  $("live").textContent = on ? "live" : "offline";
}

function connectLive() {
  const socket = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/rpc/ws`);
  ws = socket;
  socket.onopen = async () => {
    try {
      const me = await wsCall("auth", { token: state.token });
      state.userId = me.userId;
      state.isOperator = !!me.isOperator;
      backoff = 500;
      if (state.spaceId) {
        await wsCall("subscribe", { spaceId: state.spaceId });
        resync();
      }
      setLive(true);
    } catch (e) {
      if (e.code === "UNAUTHORIZED") signOut("The token was refused.");
    }
  };
  socket.onmessage = (m) => {
    let msg;
    try { msg = JSON.parse(m.data); } catch (e) { return; }
    if (msg.id !== undefined && pending.has(msg.id)) {
      const p = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) p.reject(new RpcError(msg.error.data?.code || "INTERNAL", msg.error.message, 0));
      else p.resolve(msg.result);
    } else if (msg.method === "event") {
      onEvent(msg.params);
    } else if (msg.method === "event.lagged") {
      resync();
    }
  };
  socket.onclose = () => {
    for (const p of pending.values()) p.reject(new RpcError("OFFLINE", "disconnected", 0));
    pending.clear();
    setLive(false);
    if (ws === socket && state.token) {
      setTimeout(connectLive, backoff);
      backoff = Math.min(backoff * 2, 10000);
    }
  };
}

/** Route one `{topic, spaceId, data}` event to the views it concerns. */
function onEvent({ topic, spaceId, data }) {
  if (spaceId !== state.spaceId || !data) return;
  if (topic === "maintenance.changed") { maintenance.onEvent(data); return; }
  if (topic === "computer.state") {
    const c = state.computers.get(data.computerId);
    if (c) { c.state = data.state; c.stage = data.stage || null; c.quarantined = data.quarantined === true; renderComputers(); }
    for (const v of state.bots.values()) if (v.computerId === data.computerId) v.onComputerState(data.state);
    return;
  }
  const view = state.bots.get(data.botId);
  if (!view) return;
  if (topic === "run.state") view.onRun(data);
  else if (topic === "lease.changed") view.onLease(data);
  else if (topic === "screen.state") view.screen.onScreenState(data);
  else if (topic === "computer.command") view.onCommand(data);
}

// ---- views ---------------------------------------------------------------------------------

/** How often a held control lease is renewed (it lasts 15 minutes). */
const RENEW_CONTROL_MS = 5 * 60 * 1000;

/** One bot: header with run state and control, the screen with its dock, the activity feed. */
class BotView {
  constructor(bot) {
    this.bot = bot;
    this.computerId = null;
    this.fence = null;
    this.holder = null;
    this.runState = null;
    this.notice = el("p", { class: "notice", role: "status" });
    this.runBadge = el("span", { class: "state", "data-role": "run", hidden: true });
    this.controlBadge = el("span", { class: "muted", "data-role": "control" });
    this.takeBtn = el("button", { class: "primary", "data-action": "take", onclick: () => this.take() }, "Take control");
    this.releaseBtn = el("button", { "data-action": "release", hidden: true, onclick: () => this.release() }, "Release");
    this.stopBtn = el("button", { class: "danger", "data-action": "stop", onclick: () => this.stop() }, "Stop bot");
    this.replayBtn = el("button", { class: "link", "data-action": "replay", hidden: true, onclick: () => openReplay(this.runId) }, "Replay run");
    // On a Private Computer a person may take control while the bot's run goes on.
    this.privateNote = bot.computerMode === "private"
      ? el("p", { class: "muted hint", "data-role": "private-control" },
        "Private Computer: the bot keeps running while you control its screen.")
      : null;
    const stage = el("div", { class: "stage" });
    this.screen = new Screen(stage, bot.id, () => this.screenSource());
    this.dock = new Dock(stage, this);
    this.activity = new Activity(bot.id);
    this.root = el("article", { class: "bot", "data-bot": bot.id },
      el("div", { class: "bot-head" },
        el("h3", {}, bot.name), el("span", { class: "muted" }, bot.computerMode), this.runBadge, this.controlBadge,
        el("div", { class: "actions" }, this.takeBtn, this.releaseBtn, this.stopBtn, this.replayBtn)),
      this.privateNote,
      this.notice,
      el("div", { class: "bot-body" }, el("div", { class: "screen-col" }, stage, this.dock.bar), this.activity.root));
  }

  async start() {
    try {
      // What happened before this page loaded: the active run, who holds control.
      const st = await rpc("bot.status", { botId: this.bot.id });
      const c = st.computer;
      this.computerId = c.id;
      if (st.run) this.onRun(st.run);
      if (st.control?.mine) await this.take();
      else if (st.control) { this.holder = st.control.holder; this.renderControl(); }
      if (!state.computers.has(c.id)) { state.computers.set(c.id, c); renderComputers(); }
      // Watching must not wake a computer that was stopped (it has a stored revision): Retry does.
      if (c.state === "stopped" && c.revision > 0) {
        this.screen.fail("stopped");
        this.activity.load();
        return;
      }
    } catch (e) { this.say(e.message, true); }
    if (!this.controlUrl) this.screen.open();
    this.activity.load();
  }

  /** Where the screen frame points: the control URL while we hold control, else a view URL. */
  async screenSource() {
    if (this.controlUrl) return this.controlUrl;
    return (await rpc("computer.screenUrl", { botId: this.bot.id })).url;
  }

  say(text, bad = false) {
    this.notice.textContent = text || "";
    this.notice.classList.toggle("error", bad);
  }

  get hasControl() { return this.fence !== null; }

  renderControl() {
    const mine = this.hasControl;
    // Control lasts 15 minutes unless renewed: renew while we hold it.
    clearInterval(this.renewTimer);
    this.renewTimer = mine ? setInterval(() => this.renew(), RENEW_CONTROL_MS) : null;
    this.takeBtn.hidden = mine;
    this.releaseBtn.hidden = !mine;
    this.controlBadge.textContent = mine ? "you have control" : this.holder ? "someone has control" : "";
    this.root.dataset.control = mine ? "mine" : this.holder ? "other" : "none";
    this.dock.onControl(mine);
  }

  async take() {
    this.say("");
    this.takeBtn.disabled = true;
    try {
      const g = await rpc("computer.takeControl", { botId: this.bot.id });
      this.fence = g.fence;
      this.holder = state.userId;
      this.controlUrl = g.controlUrl ? g.controlUrl.url : null;
      this.renderControl();
      if (this.controlUrl) this.screen.open();
      const running = this.runState === "running" && this.bot.computerMode === "private";
      this.say(running ? "You have control of this screen; the bot keeps running." : "You have control of this screen.");
    } catch (e) {
      this.say(e.message, true);
    } finally {
      this.takeBtn.disabled = false;
    }
  }

  async renew() {
    if (!this.hasControl) return;
    try { await rpc("computer.renewControl", { botId: this.bot.id, fence: this.fence }); }
    catch (e) { if (e.code === "LEASE_FENCED" || e.code === "CONTROL_HELD") { this.dropControl(); this.say("Control ended."); } }
  }

  async release() {
    const fence = this.fence;
    this.dropControl();
    try { await rpc("computer.releaseControl", { botId: this.bot.id, fence }); this.say("Control released."); }
    catch (e) { this.say(e.message, true); }
  }

  /**
   * The view goes (another space, signing out): its screen, shell and timers end with it. A
   * control grant held is left to lapse unrenewed, or taken again when the bot is opened again.
   */
  close() {
    clearInterval(this.renewTimer);
    this.renewTimer = null;
    this.screen.close();
    this.dock.close();
  }

  dropControl() {
    const hadUrl = !!this.controlUrl;
    this.fence = null;
    this.holder = null;
    this.controlUrl = null;
    this.renderControl();
    if (hadUrl) this.screen.open();
  }

  async stop() {
    this.say("");
    try {
      const r = await rpc("bot.stop", { botId: this.bot.id });
      const n = Array.isArray(r?.canceled) ? r.canceled.length : null;
      this.say(n === 0 ? "The bot was not running." : "The bot was stopped.");
    } catch (e) { this.say(e.message, true); }
  }

  onRun(run) {
    this.runState = run.state;
    this.runId = run.id;
    this.replayBtn.hidden = !run.id;
    this.runBadge.hidden = false;
    this.runBadge.textContent = run.state.replaceAll("_", " ");
    this.runBadge.dataset.state = run.state;
    this.root.classList.toggle("waiting", run.state === "waiting_takeover");
    if (run.state === "waiting_takeover") this.say("The bot is waiting for you to take over.");
  }

  onLease(d) {
    if (d.kind !== "control") return;
    if (d.state === "granted" || d.state === "renewed") {
      this.holder = d.holder;
      if (d.holder !== state.userId && this.hasControl) this.dropControl();
    } else if (this.fence === null || d.fence === this.fence) {
      const mine = this.hasControl;
      this.holder = null;
      if (mine) { this.dropControl(); this.say(`Control ${d.state}.`); }
    }
    this.renderControl();
  }

  onCommand(item) {
    this.activity.add(item);
    this.dock.onCommand();
  }

  onComputerState(s) {
    this.dock.onComputerState(s);
    if (s === "stopped") this.screen.fail("stopped");
    else if (s === "running" && this.screen.state !== "connected" && this.screen.state !== "opening") this.screen.open();
  }
}

/** How a computer getting ready says where it is (the image build, then the container start). */
const PREPARING = { image_build: "building the computer image", container_start: "starting the container" };

function renderComputers() {
  const list = $("computer-list");
  list.replaceChildren(...[...state.computers.values()].map((c) => {
    const preparing = c.state === "provisioning" && PREPARING[c.stage];
    // Quarantined: a command's stop was not confirmed; only a recover or reset replaces it.
    const shown = c.quarantined ? "quarantined: recover or reset it" : preparing ? `preparing: ${preparing}` : c.state;
    return el("li", { "data-computer": c.id },
      `${c.kind} computer `,
      el("span", { class: "state", "data-state": c.state, "data-stage": preparing ? c.stage : null,
        "data-quarantined": c.quarantined ? "true" : null }, shown),
      maintenance.actions(c));
  }));
}

const maintenance = new Maintenance($("maint-pills"), $("maint-dialog"));
maintenance.onChange = renderComputers;

async function openSpace(space) {
  state.spaceId = space.id;
  state.space = space;
  for (const b of document.querySelectorAll("#space-list button")) b.setAttribute("aria-current", String(b.dataset.space === space.id));
  $("space-title").textContent = space.name;
  try { await wsCall("subscribe", { spaceId: space.id }); } catch (e) { /* subscribed on (re)connect */ }
  await loadSpace();
}

async function loadSpace() {
  for (const v of state.bots.values()) v.close();
  state.bots.clear();
  state.computers.clear();
  maintenance.clear();
  $("bot-list").replaceChildren();
  maintenance.load().catch((e) => $("bot-list").prepend(el("p", { class: "error" }, e.message)));
  try {
    for (const c of await rpc("computer.list", { spaceId: state.spaceId })) state.computers.set(c.id, c);
    renderComputers();
    const bots = await rpc("bot.list", { spaceId: state.spaceId });
    if (!bots.length) $("bot-list").append(el("p", { class: "muted" }, "No bots in this space yet."));
    for (const b of bots) {
      const v = new BotView(b);
      state.bots.set(b.id, v);
      $("bot-list").append(v.root);
      v.start();
    }
  } catch (e) {
    $("bot-list").append(el("p", { class: "error" }, e.message));
  }
}

/** After a reconnect or missed events: refresh what events would have told us (not a poll). */
function resync() {
  maintenance.load().catch(() => {});
  for (const v of state.bots.values()) { v.activity.load(); v.dock.onCommand(); }
  rpc("computer.list", { spaceId: state.spaceId }).then((cs) => {
    for (const c of cs) state.computers.set(c.id, c);
    renderComputers();
  }).catch(() => {});
}

async function signIn(token) {
  state.token = token;
  const spaces = await rpc("space.list");
  sessionStorage.setItem(TOKEN_KEY, token);
  $("sign-in").hidden = true;
  $("main").hidden = false;
  $("sign-out").hidden = false;
  const list = $("space-list");
  list.replaceChildren(...spaces.map((s) =>
    el("li", {}, el("button", { "data-space": s.id, onclick: () => openSpace(s) }, s.name))));
  connectLive();
  openFromHash();
  if (spaces.length) await openSpace(spaces[0]);
  else $("bot-list").replaceChildren(el("p", { class: "muted" }, "No spaces yet."));
}

function signOut(message = "") {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = "";
  const old = ws;
  ws = null;
  if (old) old.close();
  for (const v of state.bots.values()) v.close();
  state.bots.clear();
  maintenance.clear();
  $("main").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message;
}

$("sign-in-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  $("sign-in-error").textContent = "";
  try { await signIn($("token").value.trim()); }
  catch (err) { signOut(err.code === "UNAUTHORIZED" ? "That token was not accepted." : err.message); }
});
$("sign-out").addEventListener("click", () => signOut());

if (state.token) signIn(state.token).catch((e) => signOut(e.code === "UNAUTHORIZED" ? "Please sign in again." : e.message));
else signOut();
