// Computer maintenance: Update and Recover, a compact background pill per operation with its live stage, the maintenance dialog, and the interrupted dialog whose release needs an explicit confirmation.
import { el, rpc, state } from "./app.js";

const KIND = { update: "Update", recovery: "Recovery", reset: "Reset" };
/** The real lifecycle stages an operation reports, in order. */
const STAGES = [
  ["checkpointing", "Saving live work"],
  ["tearing_down", "Removing the old machine"],
  ["provisioning", "Starting the new machine"],
  ["ready", "Ready"],
];
const STAGE_NAME = Object.fromEntries(STAGES);
const ACTIVE = new Set(["queued", "running", "interrupted"]);
const RECOVER_WARNING = "Recovery replaces the computer's machine. It first tries to save live work; if it cannot, the computer comes back from the last saved workspace and unsaved work may be lost.";
const UPDATE_TEXT = "Update rebuilds this computer with the configured provider and image. Live work is saved first; the update stops without touching the machine when it cannot be saved. Files and browser profiles in the workspace carry over; system packages installed outside it do not.";

/** What a pill says: the kind and where it stands. */
function pillText(op) {
  const kind = KIND[op.kind] || op.kind;
  if (op.state === "running") return `${kind} · ${STAGE_NAME[op.stage] || "starting"}`;
  if (op.state === "queued") return `${kind} · waiting for a worker`;
  if (op.state === "interrupted") return `${kind} interrupted`;
  if (op.state === "failed") return `${kind} failed`;
  if (op.state === "completed") return `${kind} done`;
  if (op.state === "released") return `${kind} released`;
  return `${kind} · ${op.state}`;
}

/** The space's maintenance operations: pills in `pills`, details in the `<dialog>`. */
export class Maintenance {
  constructor(pills, dialog) {
    this.pills = pills;
    this.dialog = dialog;
    /** Operations by id, as the API or the last event told. */
    this.ops = new Map();
    /** Finished operations the person closed (their pills go away). */
    this.dismissed = new Set();
    /** What the dialog shows: {opId} or {confirm: kind, computerId}. */
    this.showing = null;
    this.onChange = () => {};
    dialog.addEventListener("close", () => { this.showing = null; });
  }

  clear() {
    this.ops.clear();
    this.dismissed.clear();
    if (this.dialog.open) this.dialog.close();
    this.render();
  }

  /** Restore the space's active operations and recent failures from the API. */
  async load() {
    if (!state.spaceId) return;
    const space = state.spaceId;
    const { operations } = await rpc("computer.operations", { spaceId: space });
    if (space !== state.spaceId) return;
    const listed = new Set(operations.map((o) => o.id));
    // An active one that is no longer listed ended while we were not told: a running one
    // completed (failures stay listed), an interrupted one was released.
    for (const [id, op] of this.ops) {
      if (!listed.has(id) && ACTIVE.has(op.state)) {
        this.ops.set(id, { ...op, state: op.state === "interrupted" ? "released" : "completed" });
      }
    }
    for (const o of operations) this.ops.set(o.id, o);
    this.render();
  }

  /** A `maintenance.changed` event: the operation as it stands now. */
  onEvent(op) {
    if (!op?.id) return;
    const known = this.ops.get(op.id);
    if (known && known.updatedAtMs > op.updatedAtMs) return;
    this.ops.set(op.id, { ...known, ...op });
    this.render();
  }

  /** The operation holding a computer, if any. */
  activeOn(computerId) {
    for (const op of this.ops.values()) if (op.computerId === computerId && ACTIVE.has(op.state)) return op;
    return null;
  }

  /** Update and Recover buttons for a computer's row. */
  actions(computer) {
    const busy = !!this.activeOn(computer.id);
    return el("span", { class: "maint-actions" },
      el("button", { "data-action": "update", disabled: busy, onclick: () => this.ask("update", computer.id) }, "Update"),
      el("button", { "data-action": "recover", disabled: busy, onclick: () => this.ask("recover", computer.id) }, "Recover"));
  }

  /** Open the dialog to confirm an Update or a Recover. */
  ask(kind, computerId) {
    this.showing = { confirm: kind, computerId };
    this.renderDialog();
    if (!this.dialog.open) this.dialog.showModal();
  }

  /** Open the dialog on an operation. */
  show(opId) {
    this.showing = { opId };
    this.renderDialog();
    if (!this.dialog.open) this.dialog.showModal();
  }

  render() {
    const all = [...this.ops.values()];
    // A finished operation gives way to a newer one on the same computer.
    const superseded = (op) => !ACTIVE.has(op.state)
      && all.some((o) => o.computerId === op.computerId && o.createdAtMs > op.createdAtMs);
    const shown = all
      .filter((op) => !this.dismissed.has(op.id) && !superseded(op))
      .sort((a, b) => a.createdAtMs - b.createdAtMs);
    this.pills.replaceChildren(...shown.map((op) =>
      el("button", {
        class: "pill", "data-op": op.id, "data-computer": op.computerId, "data-state": op.state,
        "data-stage": op.stage || "", title: "Show details", onclick: () => this.show(op.id),
      }, el("span", { class: "dot" }), pillText(op))));
    if (this.dialog.open) this.renderDialog();
    this.onChange();
  }

  renderDialog() {
    const s = this.showing;
    if (!s) return;
    const body = s.confirm ? this.confirmView(s.confirm, s.computerId) : this.opView(this.ops.get(s.opId));
    this.dialog.replaceChildren(body);
  }

  close() {
    if (this.dialog.open) this.dialog.close();
  }

  confirmView(kind, computerId) {
    const message = el("p", { class: "error", role: "alert", "data-role": "maint-error" });
    const go = el("button", { type: "button", class: kind === "recover" ? "danger primary" : "primary", "data-action": `confirm-${kind}` },
      kind === "recover" ? "Recover" : "Update");
    go.addEventListener("click", async () => {
      go.disabled = true;
      try {
        const op = await rpc(kind === "recover" ? "computer.recover" : "computer.update", { computerId });
        this.onEvent(op);
        this.show(op.id);
      } catch (e) {
        message.textContent = e.message;
        go.disabled = false;
      }
    });
    return el("form", { method: "dialog", class: "maint", "data-view": `confirm-${kind}` },
      el("h3", {}, kind === "recover" ? "Recover this computer?" : "Update this computer?"),
      el("p", { class: kind === "recover" ? "warning" : "" }, kind === "recover" ? RECOVER_WARNING : UPDATE_TEXT),
      message,
      el("div", { class: "buttons" }, el("button", { value: "cancel", "data-action": "cancel" }, "Cancel"), go));
  }

  opView(op) {
    if (!op) return el("form", { method: "dialog", class: "maint" }, el("p", {}, "This operation is no longer listed."),
      el("div", { class: "buttons" }, el("button", { value: "close" }, "Close")));
    const kind = KIND[op.kind] || op.kind;
    const close = (label = "Close") => el("button", { value: "close", "data-action": "close" }, label);
    const parts = [];
    let title;
    let buttons;
    if (op.state === "queued" || op.state === "running") {
      title = `${kind} in progress`;
      parts.push(this.stages(op));
      parts.push(el("p", { class: "muted" }, "You can close this: the operation goes on in the background, and its pill shows the stage."));
      buttons = [close("Run in background")];
    } else if (op.state === "interrupted") {
      title = `${kind} interrupted`;
      parts.push(this.stages(op));
      parts.push(el("p", {}, "The worker running this operation stopped reporting. The computer stays reserved until its provider calls have settled, so nothing else can start on it meanwhile."));
      if (canRelease()) {
        parts.push(el("p", {}, "If that worker is gone for good: stop the affected workers and make sure their provider operations have stopped, then release the computer. Recovery becomes available after that."));
        const sure = el("input", { type: "checkbox", id: "workers-stopped", "data-role": "workers-stopped" });
        const release = el("button", { type: "button", class: "danger", "data-action": "release-interrupted", disabled: true }, "Release computer");
        const message = el("p", { class: "error", role: "alert", "data-role": "maint-error" });
        sure.addEventListener("change", () => { release.disabled = !sure.checked; });
        release.addEventListener("click", async (e) => {
          e.preventDefault();
          if (!sure.checked) return;
          release.disabled = true;
          try {
            this.onEvent(await rpc("computer.releaseInterrupted", { id: op.id, workersStopped: sure.checked }));
          } catch (err) {
            message.textContent = err.message;
            release.disabled = false;
          }
        });
        parts.push(el("label", { class: "confirm" }, sure, " I stopped the workers and verified that their provider operations have stopped."));
        parts.push(message);
        buttons = [close(), release];
      } else {
        parts.push(el("p", { class: "muted", "data-role": "ask-owner" }, "The server owner can release it once the workers are stopped."));
        buttons = [close()];
      }
    } else if (op.state === "released") {
      title = `${kind} released`;
      parts.push(el("p", {}, "The computer is released. Recover it to bring it back."));
      parts.push(el("p", { class: "warning" }, RECOVER_WARNING));
      buttons = [close(), this.recoverButton(op)];
    } else if (op.state === "failed") {
      title = `${kind} failed`;
      parts.push(this.stages(op));
      parts.push(el("p", { class: "error", "data-role": "maint-failure" }, op.error || "The operation failed."));
      if (op.note) parts.push(el("p", { class: "warning" }, op.note));
      parts.push(el("p", { class: "warning" }, RECOVER_WARNING));
      buttons = [this.dismissButton(op), this.recoverButton(op)];
    } else {
      title = `${kind} finished`;
      parts.push(this.stages(op));
      if (op.note) parts.push(el("p", { class: "warning", "data-role": "maint-note" }, op.note));
      buttons = [this.dismissButton(op, "Close")];
    }
    return el("form", { method: "dialog", class: "maint", "data-view": op.state, "data-op": op.id },
      el("h3", {}, title), ...parts, el("div", { class: "buttons" }, ...buttons));
  }

  /** The stages with the one reached marked (no percentages: only what really happened). */
  stages(op) {
    const at = STAGES.findIndex(([s]) => s === op.stage);
    const finished = op.state === "completed";
    return el("ol", { class: "stages", "data-role": "stages" }, ...STAGES
      .filter(([s]) => op.kind !== "reset" || s !== "checkpointing")
      .map(([s, name]) => {
        const i = STAGES.findIndex(([x]) => x === s);
        const status = finished || i < at ? "done" : i === at ? (op.state === "running" ? "current" : op.state) : "pending";
        return el("li", { "data-stage": s, "data-status": status }, name);
      }));
  }

  recoverButton(op) {
    const b = el("button", { type: "button", class: "danger primary", "data-action": "recover-from-dialog" }, "Recover");
    b.addEventListener("click", (e) => { e.preventDefault(); this.ask("recover", op.computerId); });
    return b;
  }

  dismissButton(op, label = "Dismiss") {
    const b = el("button", { value: "close", "data-action": "dismiss" }, label);
    b.addEventListener("click", () => { this.dismissed.add(op.id); this.render(); });
    return b;
  }
}

/** Releasing an interrupted operation is for the server owner, in a space they own. */
function canRelease() {
  return state.isOperator && state.space?.ownerId === state.userId;
}
