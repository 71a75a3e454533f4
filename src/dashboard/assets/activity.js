// The Activity feed of one bot: its computer.command history (activity.list) and the live events, newest first.
import { el, rpc } from "./app.js";

const PAGE = 50;

function when(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export class Activity {
  constructor(botId) {
    this.botId = botId;
    this.items = new Map();
    this.list = el("ol", { "data-role": "activity" });
    this.more = el("button", { class: "link", hidden: true, onclick: () => this.older() }, "Older");
    this.empty = el("p", { class: "muted" }, "No activity yet.");
    this.root = el("aside", { class: "activity" }, el("h4", {}, "Activity"), this.empty, this.list, this.more);
  }

  /** The latest page of history (also after a reconnect); live events are merged in by id. */
  async load() {
    try {
      const rows = await rpc("activity.list", { botId: this.botId, limit: PAGE });
      for (const r of rows) this.add(r);
      if (this.oldest === undefined) this.more.hidden = rows.length < PAGE;
    } catch (e) {
      this.empty.textContent = e.message;
      this.empty.hidden = false;
    }
  }

  async older() {
    const rows = await rpc("activity.list", { botId: this.botId, beforeMs: this.oldest, limit: PAGE }).catch(() => []);
    for (const r of rows) this.add(r);
    this.more.hidden = rows.length < PAGE;
  }

  get oldest() {
    let min;
    for (const r of this.items.values()) if (min === undefined || r.createdAtMs < min) min = r.createdAtMs;
    return min;
  }

  /** Insert one `computer.command` item in time order (newest first); repeats are ignored. */
  add(r) {
    if (!r || this.items.has(r.id)) return;
    this.items.set(r.id, r);
    const detail = [];
    if (r.sizeBytes !== null && r.sizeBytes !== undefined) detail.push(`${r.sizeBytes} bytes`);
    const node = el("li", { class: r.error ? "failed" : "", "data-activity": r.id, "data-at": String(r.createdAtMs) },
      el("div", {}, el("span", { class: "when" }, `${when(r.createdAtMs)} · ${r.tool}${detail.length ? " · " + detail.join(", ") : ""}`)),
      el("div", { class: "cmd" }, r.command || r.tool),
      r.outputTail ? el("pre", {}, r.outputTail) : null,
      r.error ? el("div", { class: "error" }, r.error) : null);
    const after = [...this.list.children].find((li) => Number(li.dataset.at) < r.createdAtMs);
    this.list.insertBefore(node, after || null);
    this.empty.hidden = true;
  }
}
