// The dock over a bot's screen: the Files window (browse, preview, upload, download), the Terminal window, the browser button.
import { el, rpc } from "./app.js";
import { TerminalWindow } from "./terminal.js";

const REFRESH_MS = 4000;
const MAX_UPLOAD = 8 * 1024 * 1024;

function human(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function toBase64(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ""));
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

/** The Files window: the bot's workspace, also from the stored copy when the computer is stopped. */
class FilesWindow {
  constructor(bot) {
    this.bot = bot;
    this.path = "";
    this.from = "";
    this.live = false;
    this.selected = null;
    this.timer = null;
    this.busy = false;
    this.pathLabel = el("span", { class: "path", "data-role": "path" }, "/");
    this.list = el("ul", { "data-role": "entries" });
    this.preview = el("div", { "data-role": "preview" });
    this.message = el("span", { "data-role": "files-message", role: "status" });
    this.upload = el("input", { type: "file", "data-role": "upload", onchange: () => this.onUpload() });
    this.uploadHint = el("span", { class: "muted" }, "Take control to upload.");
    this.download = el("button", { "data-action": "download", onclick: () => this.onDownload() }, "Download");
    this.root = el("section", { class: "win files", "data-window": "files", hidden: true },
      el("header", {},
        el("span", { class: "title" }, "Files"), this.pathLabel, el("span", { class: "spacer" }),
        el("button", { "data-action": "up", onclick: () => this.cd(this.path.split("/").slice(0, -1).join("/")) }, "Up"),
        el("button", { "data-action": "refresh", onclick: () => this.refresh() }, "Refresh")),
      el("div", { class: "content" }, this.list, this.preview),
      el("div", { class: "foot" }, this.upload, this.uploadHint, this.download, this.message));
    this.setControl(false);
  }

  get visible() { return !this.root.hidden && !this.root.closest("[data-dock-hidden='true']"); }

  show() { this.root.hidden = false; this.resume(); }
  hide() { this.root.hidden = true; this.pause(); }
  /** Refresh the open folder every few seconds while visible. */
  resume() {
    if (!this.visible) return;
    this.refresh();
    clearInterval(this.timer);
    this.timer = setInterval(() => { if (this.visible && !document.hidden) this.refresh(); }, REFRESH_MS);
  }
  pause() { clearInterval(this.timer); this.timer = null; }

  say(text, bad = false) {
    this.message.textContent = text;
    this.message.classList.toggle("error", bad);
    clearTimeout(this.sayTimer);
    if (text) this.sayTimer = setTimeout(() => { this.message.textContent = ""; }, 8000);
  }

  setControl(mine) {
    this.upload.disabled = !mine;
    this.uploadHint.hidden = mine;
  }

  cd(path) { this.path = path; this.from = ""; this.selected = null; this.preview.replaceChildren(); this.refresh(); }
  /** Shows the folder's page that starts at the name `from` ("": its first entries). */
  page(from) { this.from = from; this.refresh(); }

  async refresh() {
    // A refresh asked for while one is under way (another folder, another page) follows it.
    if (this.busy) { this.again = true; return; }
    this.busy = true;
    this.again = false;
    try {
      const page = this.from ? { from: this.from } : {};
      const r = await rpc("files.list", { botId: this.bot.bot.id, path: this.path, ...page });
      this.live = r.live;
      this.root.dataset.live = String(r.live);
      this.pathLabel.textContent = `/${this.path}${r.live ? "" : " (stored copy)"}`;
      this.list.replaceChildren(...r.entries.map((e) => el("li", {},
        el("button", { "data-entry": e.path, "data-kind": e.kind, onclick: () => (e.kind === "dir" ? this.cd(e.path) : this.open(e)) },
          el("span", {}, e.kind === "dir" ? `${e.name}/` : e.name),
          el("span", { class: "size" }, e.kind === "dir" ? "" : human(e.size))))));
      if (!r.entries.length) this.list.append(el("li", { class: "muted" }, this.from ? "No entries from here on." : "This folder is empty."));
      if (r.truncated || this.from) {
        // A large folder comes a page at a time, by name; the page is kept across refreshes.
        const where = this.from ? `from ${this.from}` : "the first";
        this.list.append(el("li", { class: "muted", "data-role": "more" },
          `${r.entries.length} of ${r.total} entries by name, ${where}. `,
          this.from ? el("button", { "data-action": "first-page", onclick: () => this.page("") }, "First page") : null,
          r.next ? el("button", { "data-action": "next-page", onclick: () => this.page(r.next) }, "Next page") : null));
      }
    } catch (e) {
      this.say(e.message, true);
    } finally {
      this.busy = false;
      if (this.again) this.refresh();
    }
  }

  async open(entry) {
    this.selected = entry;
    try {
      const r = await rpc("files.read", { botId: this.bot.bot.id, path: entry.path });
      // Another file was chosen (or another folder) while this one was read: it is not shown.
      if (this.selected !== entry) return;
      entry.read = r;
      this.preview.replaceChildren(el("div", { class: "muted" }, `${entry.path} · ${human(r.size)}`),
        r.text !== undefined ? el("pre", { "data-role": "text" }, r.text) : el("p", { class: "muted" }, "Binary file: no preview."));
    } catch (e) {
      if (this.selected === entry) this.preview.replaceChildren(el("p", { class: "error" }, e.message));
    }
  }

  onDownload() {
    if (!this.selected) return this.say("Choose a file first.", true);
    if (!this.live) return this.say("Download needs a running computer: this one is stopped (browse and preview still work).", true);
    const r = this.selected.read;
    if (!r) return;
    // Typed as bytes: whatever the file holds, nothing reads it as a page of this origin.
    const type = { type: "application/octet-stream" };
    const blob = r.text !== undefined ? new Blob([r.text], type)
      : new Blob([Uint8Array.from(atob(r.base64), (c) => c.charCodeAt(0))], type);
    const a = el("a", { href: URL.createObjectURL(blob), download: this.selected.name });
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    this.say("");
  }

  async onUpload() {
    const file = this.upload.files[0];
    if (!file) return;
    if (file.size > MAX_UPLOAD) { this.say("Uploads are limited to 8 MiB.", true); this.upload.value = ""; return; }
    this.say(`Uploading ${file.name}…`);
    try {
      const r = await rpc("files.upload", { botId: this.bot.bot.id, name: file.name, contentBase64: await toBase64(file) });
      this.say(`Uploaded to ${r.path}.`);
      this.cd(r.path.split("/").slice(0, -1).join("/"));
    } catch (e) {
      this.say(e.message, true);
    } finally {
      this.upload.value = "";
    }
  }
}

/** The dock bar and its windows; the browser button hides the windows and keeps their sessions. */
export class Dock {
  constructor(stage, bot) {
    this.files = new FilesWindow(bot);
    this.terminal = new TerminalWindow(bot);
    this.layer = el("div", { "data-dock-hidden": "false" }, this.files.root, this.terminal.root);
    this.buttons = {
      files: el("button", { "data-dock": "files", "aria-pressed": "false", onclick: () => this.toggle("files") }, "Files"),
      terminal: el("button", { "data-dock": "terminal", "aria-pressed": "false", onclick: () => this.toggle("terminal") }, "Terminal"),
      browser: el("button", { "data-dock": "browser", "aria-pressed": "true", title: "Show the whole screen", onclick: () => this.showBrowser() }, "Browser"),
    };
    stage.append(this.layer);
    // Below the screen, never over it: the bot's window keeps its title-bar buttons visible.
    this.bar = el("div", { class: "dock-bar" }, this.buttons.browser, this.buttons.files, this.buttons.terminal);
  }

  toggle(name) {
    const w = this[name];
    this.layer.dataset.dockHidden = "false";
    this.layer.hidden = false;
    if (w.root.hidden) w.show(); else w.hide();
    this.files.resume();
    this.sync();
  }

  /** Hide every window (their state is kept) so the whole screen shows. */
  showBrowser() {
    const hidden = this.layer.dataset.dockHidden === "true";
    this.layer.dataset.dockHidden = String(!hidden);
    this.layer.hidden = !hidden;
    if (hidden) this.files.resume(); else this.files.pause();
    this.sync();
  }

  sync() {
    const shown = this.layer.dataset.dockHidden !== "true";
    for (const name of ["files", "terminal"]) this.buttons[name].setAttribute("aria-pressed", String(shown && !this[name].root.hidden));
    this.buttons.browser.setAttribute("aria-pressed", String(!shown || (this.files.root.hidden && this.terminal.root.hidden)));
  }

  onControl(mine) { this.files.setControl(mine); this.terminal.setControl(mine); }
  /** The bot's view goes: no more listings, the shell closed. */
  close() { this.files.pause(); this.terminal.close(); }
  onCommand() { if (this.files.visible) this.files.refresh(); }
  onComputerState() { if (this.files.visible) this.files.refresh(); }
}
