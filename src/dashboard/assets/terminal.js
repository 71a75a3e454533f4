// The Terminal window of the dock: a shell for the person holding control, over computer.terminalUrl in the terminal frame protocol.
import { el, rpc } from "./app.js";

// Frames: kind u8 | length u32 BE | payload (see the README's "Browser terminal").
const DATA = 1, RESIZE = 2, EXIT = 3, HELLO = 4;
const MAX_PAYLOAD = 65536;
const RECONNECT_MS = 1000;
const COLS = 100, ROWS = 24;
/**
 * term.js answers a settings or termcap query (`ESC P $ q …`, `ESC P + q …`) with the query's
 * own text as if it were typed: what the computer prints never comes back as the person's
 * input, so these answers are dropped.
 */
const QUERY_REPLY = /\x1bP[01]?[$+]r[^\x1b]*\x1b\\/g;

function frame(kind, payload) {
  const out = new Uint8Array(5 + payload.length);
  out[0] = kind;
  new DataView(out.buffer).setUint32(1, payload.length);
  out.set(payload, 5);
  return out;
}

function resizeFrame(cols, rows) {
  const p = new Uint8Array(4);
  const v = new DataView(p.buffer);
  v.setUint16(0, cols);
  v.setUint16(2, rows);
  return frame(RESIZE, p);
}

/** Reassembles frames from websocket messages, whose boundaries mean nothing. */
class FrameReader {
  constructor() { this.buf = new Uint8Array(0); }
  push(bytes) {
    const next = new Uint8Array(this.buf.length + bytes.length);
    next.set(this.buf);
    next.set(bytes, this.buf.length);
    this.buf = next;
  }
  *frames() {
    while (this.buf.length >= 5) {
      const v = new DataView(this.buf.buffer, this.buf.byteOffset);
      const len = v.getUint32(1);
      if (len > MAX_PAYLOAD) throw new Error("terminal frame too long");
      if (this.buf.length < 5 + len) return;
      const kind = this.buf[0];
      const payload = this.buf.slice(5, 5 + len);
      this.buf = this.buf.slice(5 + len);
      yield { kind, payload };
    }
  }
}

let library = null;
/** term.js (Debian's libjs-term.js), served by the binary and loaded on first use. */
function loadTerminal() {
  if (window.Terminal) return Promise.resolve(window.Terminal);
  if (!library) {
    library = new Promise((resolve, reject) => {
      const script = el("script", { src: "/assets/vendor/term.js" });
      script.onload = () => (window.Terminal ? resolve(window.Terminal) : reject(new Error("The terminal library did not load.")));
      script.onerror = () => {
        library = null;
        reject(new Error("The terminal library is not installed on this server (Debian package libjs-term.js)."));
      };
      document.head.append(script);
    });
  }
  return library;
}

/** The Terminal window: starts on first use, stays connected while hidden, reconnects to a fresh shell when the connection drops. */
export class TerminalWindow {
  constructor(view) {
    this.view = view;
    this.mine = false;
    this.socket = null;
    this.connecting = false;
    this.term = null;
    this.retry = null;
    this.status = el("span", { class: "muted", "data-role": "terminal-status", role: "status" });
    this.openBtn = el("button", { "data-action": "open-shell", onclick: () => this.openShell() }, "Open shell");
    this.screen = el("div", { class: "term-screen", "data-role": "terminal", onclick: () => this.focus() });
    this.root = el("section", { class: "win terminal", "data-window": "terminal", "data-shell": "idle", hidden: true },
      el("header", {}, el("span", { class: "title" }, "Terminal"), el("span", { class: "spacer" }), this.status, this.openBtn),
      el("div", { class: "content" }, this.screen));
    this.setShell("idle", "Take control to open a shell.");
    this.render();
  }

  show() { this.root.hidden = false; if (this.mine) this.connect(); this.render(); }
  /** Hidden windows keep their shell. */
  hide() { this.root.hidden = true; }

  setControl(mine) {
    if (this.mine === mine) return;
    this.mine = mine;
    if (!mine) this.disconnect("Control ended. Open a shell to take control again.");
    else if (!this.root.hidden) this.connect();
    this.render();
  }

  setShell(state, text = "") {
    this.root.dataset.shell = state;
    this.status.textContent = text;
    this.status.classList.toggle("error", state === "failed");
  }

  render() { this.openBtn.hidden = this.mine; }

  /** Without control: take it, then connect. */
  async openShell() {
    await this.view.take();
    if (this.view.hasControl) this.connect();
  }

  async connect() {
    if (this.socket || this.connecting || !this.mine) return;
    this.connecting = true;
    clearTimeout(this.retry);
    this.setShell("connecting", "Connecting…");
    try {
      const Terminal = await loadTerminal();
      if (!this.term) {
        this.term = new Terminal({ cols: COLS, rows: ROWS, cursorBlink: false, useStyle: false });
        this.term.open(this.screen);
        this.term.on("data", (d) => {
          const typed = d.replace(QUERY_REPLY, "");
          if (typed) this.send(frame(DATA, new TextEncoder().encode(typed)));
        });
      }
      const { url } = await rpc("computer.terminalUrl", { botId: this.view.bot.id });
      if (!this.mine) return;
      this.attach(new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${url}`));
    } catch (e) {
      this.setShell("failed", e.message);
    } finally {
      this.connecting = false;
    }
  }

  attach(ws) {
    ws.binaryType = "arraybuffer";
    const reader = new FrameReader();
    const decoder = new TextDecoder();
    this.socket = ws;
    ws.onopen = () => {
      ws.send(resizeFrame(COLS, ROWS));
      this.setShell("connected", "");
      this.focus();
    };
    ws.onmessage = (ev) => {
      reader.push(new Uint8Array(ev.data));
      try {
        for (const f of reader.frames()) {
          if (f.kind === DATA) this.term.write(decoder.decode(f.payload, { stream: true }));
          else if (f.kind === EXIT) this.term.write(`\r\n[the shell exited with status ${new DataView(f.payload.buffer).getInt32(0)}]\r\n`);
          else if (f.kind !== HELLO) throw new Error("unexpected terminal frame");
        }
      } catch { ws.close(); }
    };
    ws.onclose = (ev) => {
      if (this.socket !== ws) return;
      this.socket = null;
      if (ev.reason === "revoked" || !this.mine) {
        this.setShell("closed", "The shell ended with control.");
        this.render();
        return;
      }
      // The connection dropped (or the shell exited): a fresh shell after a moment.
      this.term.write("\r\n[connection lost: starting a fresh shell]\r\n");
      this.setShell("reconnecting", "Reconnecting…");
      this.retry = setTimeout(() => this.connect(), RECONNECT_MS);
    };
  }

  /** Keys go to the shell (term.js listens on its focused element). */
  focus() {
    if (!this.term) return;
    this.term.focus();
    this.term.element.focus();
  }

  send(bytes) {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(bytes);
  }

  /** The view goes: the shell closes and keys no longer reach it. */
  close() {
    this.disconnect("");
    this.term?.blur();
  }

  disconnect(message) {
    clearTimeout(this.retry);
    const ws = this.socket;
    this.socket = null;
    if (ws) ws.close();
    this.setShell("closed", message);
  }
}
