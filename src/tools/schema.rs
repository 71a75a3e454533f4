//! The tool set agents see: names, descriptions and JSON Schemas of their inputs.

use serde_json::{Value, json};

/// How every tool reads a workspace path.
const PATH_RULE: &str = "A path relative to your folder, the same folder `shell` starts in: `bots/<your bot id>/` on a Team Computer, the workspace root on a Private Computer. A path starting with `/` starts at the workspace root, so a Team's shared files are `../../shared/...` or `/shared/...`. `..` may not leave the workspace.";

/// How every screenshot reads `max_width` and `max_height`.
const SCALE_RULE: &str = "Optional: return the screenshot scaled down (aspect ratio kept) to at most this many pixels; the answer then gives `scale`, `screenWidth` and `screenHeight`. Action coordinates are always screen pixels: divide image coordinates by `scale`.";

/// One tool's definition, in the shape MCP's `tools/list` uses.
pub fn definitions() -> Vec<Value> {
    let path = json!({ "type": "string", "description": PATH_RULE });
    let max_width =
        json!({ "type": "integer", "minimum": super::MIN_FRAME_SIDE, "description": SCALE_RULE });
    let max_height =
        json!({ "type": "integer", "minimum": super::MIN_FRAME_SIDE, "description": SCALE_RULE });
    vec![
        tool(
            "computer_observe",
            "Take a screenshot of your screen, at full size or scaled down to `max_width`/`max_height`. Identical consecutive frames come back without image bytes: the previous screenshot is still valid.",
            json!({ "type": "object", "additionalProperties": false, "properties": {
                "max_width": max_width.clone(), "max_height": max_height.clone() } }),
        ),
        tool(
            "computer_act",
            "Perform an ordered batch of mouse and keyboard actions on your screen, wait for it to settle, and return the resulting screenshot (scaled down to `max_width`/`max_height` when given; coordinates are screen pixels).",
            json!({ "type": "object", "required": ["actions"], "additionalProperties": false, "properties": {
                "max_width": max_width, "max_height": max_height,
                "actions": { "type": "array", "minItems": 1, "maxItems": 50, "items": { "type": "object", "required": ["type"], "properties": {
                    "type": { "enum": ["move", "click", "drag", "scroll", "type", "key", "wait"] },
                    "x": { "type": "integer" }, "y": { "type": "integer" },
                    "button": { "enum": ["left", "middle", "right"] }, "double": { "type": "boolean" },
                    "from_x": { "type": "integer" }, "from_y": { "type": "integer" },
                    "to_x": { "type": "integer" }, "to_y": { "type": "integer" },
                    "dx": { "type": "integer" }, "dy": { "type": "integer" },
                    "text": { "type": "string" }, "keys": { "type": "string", "description": "For example `ctrl+l` or `Return`." },
                    "ms": { "type": "integer", "minimum": 0, "maximum": 10000 } } } } } }),
        ),
        tool(
            "open_path",
            "Open a workspace file or a URL in your browser.",
            json!({ "type": "object", "required": ["path"], "additionalProperties": false, "properties": {
                "path": { "type": "string", "description": format!("An http(s) URL, or a workspace path. {PATH_RULE}") } } }),
        ),
        tool(
            "launch_app",
            "Start a graphical program on your screen.",
            json!({ "type": "object", "required": ["command"], "additionalProperties": false, "properties": {
                "command": { "type": "string" }, "args": { "type": "array", "items": { "type": "string" } } } }),
        ),
        tool(
            "shell",
            "Run a shell command on your computer, in your folder (`bots/<your bot id>/` on a Team Computer, the workspace root on a Private Computer) unless `cwd` says otherwise. Returns the exit code and the tail of its output.",
            json!({ "type": "object", "required": ["command"], "additionalProperties": false, "properties": {
                "command": { "type": "string" }, "cwd": path.clone(),
                "timeout_ms": { "type": "integer", "minimum": 1 } } }),
        ),
        tool(
            "read_file",
            "Read a workspace file (at most 8 MiB).",
            json!({ "type": "object", "required": ["path"], "additionalProperties": false, "properties": { "path": path.clone() } }),
        ),
        tool(
            "write_file",
            "Write a workspace file, creating folders as needed.",
            json!({ "type": "object", "required": ["path"], "additionalProperties": false, "properties": {
                "path": path.clone(), "content": { "type": "string" },
                "content_base64": { "type": "string", "description": "Binary content instead of `content`." } } }),
        ),
        tool(
            "list_files",
            "List a workspace folder: 1000 entries by name, from the name `from` on when given; `total` says how many it has, `next` the name to list from for the entries that follow.",
            json!({ "type": "object", "additionalProperties": false, "properties": {
                "path": path.clone(), "from": { "type": "string", "maxLength": 255 } } }),
        ),
        tool(
            "attach_file",
            "Attach a workspace file to your answer (at most 8 MiB).",
            json!({ "type": "object", "required": ["path"], "additionalProperties": false, "properties": { "path": path } }),
        ),
        tool(
            "browser_navigate",
            "Load an http(s) URL in your browser's active tab and wait for it.",
            json!({ "type": "object", "required": ["url"], "additionalProperties": false, "properties": {
                "url": { "type": "string" } } }),
        ),
        tool(
            "browser_snapshot",
            "Read the active tab: bounded page text and up to 80 interactive elements with refs (password values masked), inside web components' open shadow roots too. The page's frames are read too, those of other origins included (listed in frames): their elements carry the frame's number and browser_act works on them.",
            json!({ "type": "object", "properties": {}, "additionalProperties": false }),
        ),
        tool(
            "browser_act",
            "Act on an element of the last browser_snapshot by its ref: click, type (replaces the value), press a key, select an option of a select element (text: the option's value or label, as the snapshot lists them), or upload a workspace file into a file input (text: its path, as the file tools take it). A stale ref is refused; nothing is replayed.",
            json!({ "type": "object", "required": ["ref", "action"], "additionalProperties": false, "properties": {
                "ref": { "type": "string" }, "action": { "enum": ["click", "type", "press", "select", "upload"] },
                "text": { "type": "string" } } }),
        ),
        tool(
            "browser_dialog",
            "Answer the JavaScript dialog (alert, confirm, prompt, leave-page) open on your browser's page: accept (OK, with text for a prompt) or dismiss (Cancel). While one is open, browser_snapshot and browser_act answer PAGE_DIALOG_OPEN and do nothing, and browser_navigate dismisses it (its answer says so); an action or navigation that opens one names it in its answer.",
            json!({ "type": "object", "required": ["accept"], "additionalProperties": false, "properties": {
                "accept": { "type": "boolean" }, "text": { "type": "string" } } }),
        ),
        tool(
            "request_takeover",
            "Ask a person to take over your screen (a login, 2FA, a CAPTCHA, or a judgement call). Your run waits until they release control.",
            json!({ "type": "object", "additionalProperties": false, "properties": { "reason": { "type": "string" } } }),
        ),
    ]
}

fn tool(name: &str, description: &str, input_schema: Value) -> Value {
    json!({ "name": name, "description": description, "inputSchema": input_schema })
}
