// One bot's framed screen: fetch the proxied page once before framing, follow the reporter's messages, 15 s watchdog, Retry.
import { el } from "./app.js";

/** Fixed human reasons; the proxy's own status text is never shown. */
export const REASONS = {
  refused: "The screen did not respond.",
  failed: "The screen did not respond.",
  disconnected: "The screen disconnected.",
  unavailable: "The screen is not available.",
  stopped: "The computer is stopped. Retry starts it.",
};
/** How long a frame may stay silent or at `loading` before it counts as failed. */
export const WATCHDOG_MS = 15000;

export class Screen {
  /** `source` is an async function returning the URL to frame (view or control). */
  constructor(stage, botId, source) {
    this.stage = stage;
    this.botId = botId;
    this.source = source;
    this.frame = null;
    this.timer = null;
    this.attempt = 0;
    this.status = el("span", { class: "screen-status" });
    this.overlay = el("div", { class: "screen-overlay" });
    stage.append(this.overlay, this.status);
    this.onMessage = this.onMessage.bind(this);
    window.addEventListener("message", this.onMessage);
    this.setState("idle");
  }

  setState(s) {
    this.state = s;
    this.stage.dataset.screen = s;
    this.status.textContent = s === "connected" ? "live" : s;
  }

  showOverlay(text, retry) {
    const children = [el("p", { "data-role": "screen-message" }, text)];
    if (retry) children.push(el("button", { class: "primary", "data-action": "retry", onclick: () => this.open() }, "Retry"));
    this.overlay.replaceChildren(...children);
    this.overlay.hidden = false;
  }

  dropFrame() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.frame) { this.frame.remove(); this.frame = null; }
  }

  fail(kind, reason) {
    this.dropFrame();
    this.setState(kind === "disconnected" ? "disconnected" : "failed");
    this.showOverlay(reason || REASONS[kind] || REASONS.failed, true);
  }

  /** (Re)open the screen: a fresh URL, fetched once, then framed. */
  async open() {
    const attempt = ++this.attempt;
    this.dropFrame();
    this.setState("opening");
    this.showOverlay("Opening the screen…", false);
    let url;
    try {
      url = await this.source();
    } catch (e) {
      if (attempt === this.attempt) this.fail("unavailable", e.message);
      return;
    }
    if (attempt !== this.attempt) return;
    try {
      const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (!resp.ok || resp.headers.get("x-rakazo-screen-reason")) {
        if (attempt === this.attempt) this.fail("refused");
        return;
      }
    } catch (e) {
      if (attempt === this.attempt) this.fail("refused");
      return;
    }
    if (attempt !== this.attempt) return;
    // Scripts only: the screen runs in an opaque origin and can never read this page's storage
    // (the API token) or call the API as us; its messages come from origin "null".
    const frame = el("iframe", { sandbox: "allow-scripts", title: "Bot screen", referrerpolicy: "no-referrer" });
    frame.src = url;
    this.frame = frame;
    this.setState("loading");
    this.stage.prepend(frame);
    this.timer = setTimeout(() => {
      if (this.frame === frame && (this.state === "loading")) this.fail("failed");
    }, WATCHDOG_MS);
  }

  /** A reporter message `{type: "rakazo.screen", state}` from our frame (told apart by its
   * window: a sandboxed frame's origin is "null"). */
  onMessage(e) {
    if (!this.frame || e.source !== this.frame.contentWindow) return;
    const d = e.data;
    if (!d || d.type !== "rakazo.screen" || typeof d.state !== "string") return;
    switch (d.state) {
      case "loading":
        this.setState("loading");
        break;
      case "connecting":
        this.setState("connecting");
        break;
      case "connected":
        clearTimeout(this.timer);
        this.setState("connected");
        this.overlay.hidden = true;
        break;
      case "failed":
        this.fail("failed");
        break;
      case "disconnected":
        this.fail("disconnected");
        break;
    }
  }

  /** `screen.state` events: a torn-down slot kills our capability; a new one is worth a reopen. */
  onScreenState(d) {
    if (d.state === "torn_down") this.fail("disconnected");
  }

  /** Close the viewer (the desktop stays as it is). */
  close() {
    this.attempt++;
    this.dropFrame();
    window.removeEventListener("message", this.onMessage);
  }
}
