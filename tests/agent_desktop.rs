//! A scripted agent on a real desktop (no model): it opens a local fixture page in its
//! browser, clicks into a field and types through one `computer_act` batch, and the page's
//! server records the value; shell and file tools round-trip on the same computer; the page
//! tools follow the tab on the screen, whatever a page in the background claims, and the
//! document in it through navigation and the back-forward cache, and the page's JavaScript
//! dialogs are named, refused around and answered.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Backend, TestServer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PAGE: &str = r#"<!doctype html><html><body style="margin:0">
<input id="f" style="position:absolute;left:0;top:0;width:100%;height:100%;font-size:40px" placeholder="type here">
<script>
document.getElementById('f').addEventListener('keyup', e => {
  if (e.key === 'Enter') fetch('/typed?v=' + encodeURIComponent(e.target.value));
});
</script></body></html>"#;

const FORM: &str = r#"<!doctype html><html><head><title>Sign in</title></head><body>
<h1>Sign in</h1>
<input id="user" placeholder="user name"><input id="pw" type="password" value="hunter2" placeholder="password">
<button id="go" onclick="this.remove(); document.body.insertAdjacentHTML('beforeend', '<button>Go again</button>')">Go</button>
</body></html>"#;

/// A page that claims to be on the screen when it is not.
const LIAR: &str = r#"<!doctype html><html><head><title>Liar</title></head><body>
<script>Object.defineProperty(Document.prototype, 'visibilityState', { get: () => 'visible' });
Object.defineProperty(Document.prototype, 'hidden', { get: () => false });</script>
<button onclick="fetch('/typed?v=liar')">Go</button></body></html>"#;

/// Two pages of one site, alike in shape: a link and a button that reports which page it is
/// on. The first says when it was shown again from the back-forward cache.
const FIRST: &str = r#"<!doctype html><html><head><title>First</title></head><body>
<a href="/second">Second page</a><button onclick="fetch('/typed?v=first')">Mark</button>
<script>addEventListener('pageshow', e => { if (e.persisted) document.title = 'First again'; });</script>
</body></html>"#;
const SECOND: &str = r#"<!doctype html><html><head><title>Second</title></head><body>
<a href="/first">First page</a><button onclick="fetch('/typed?v=second')">Mark</button>
<button onclick="history.back()">Back</button></body></html>"#;

/// A page whose buttons open JavaScript dialogs and put the answers in its title.
const DIALOGS: &str = r#"<!doctype html><html><head><title>Dialogs</title></head><body>
<button onclick="document.title = confirm('Delete it?') ? 'Deleted' : 'Kept'">Confirm</button>
<button onclick="document.title = 'Hello ' + prompt('Your name?', 'nobody')">Prompt</button>
<button onclick="setTimeout(() => { alert('Later'); document.title = 'Alerted'; }, 1000)">Later</button>
</body></html>"#;

/// A page that asks before it is left (a form with unsaved changes).
const UNSAVED: &str = r#"<!doctype html><html><head><title>Unsaved</title></head><body>
<input placeholder="note"><a href="/first">Leave</a>
<script>onbeforeunload = e => { e.preventDefault(); e.returnValue = ''; };</script></body></html>"#;

/// A form with a select element; the page reports each choice it is told of.
const CHOOSE: &str = r#"<!doctype html><html><head><title>Choose</title></head><body>
<label for="fruit">Fruit</label>
<select id="fruit" onchange="fetch('/typed?v=' + this.value); document.title = 'Chose ' + this.value">
<option value="a">Apple</option><option value="b">Banana</option><option value="c" disabled>Cherry</option>
</select></body></html>"#;

/// A form with a file input; the page names the file it is given.
const UPLOAD: &str = r#"<!doctype html><html><head><title>Upload</title></head><body>
<input type="file" aria-label="Attachment"
 onchange="document.title = 'Picked ' + this.files[0].name + ' ' + this.files[0].size">
<button>Send</button></body></html>"#;

/// A page that greets with an alert while it loads.
const WELCOME: &str =
    "<!doctype html><title>Welcome</title><script>alert('Welcome aboard')</script><p>in</p>";

/// A page with a link to a file the site sends as an attachment.
const FILES: &str = r#"<!doctype html><html><head><title>Files</title></head><body>
<a href="/report">Report</a></body></html>"#;

/// A file the fixture site sends as an attachment (`/report`).
const REPORT: &str = "month,total\njanuary,12\n";

/// A page with a frame of its own origin, offset by its border and padding; the same form
/// again in a frame of another site (the fixture by the name `localhost`: a process of its
/// own) and in a frame of the same site but another origin (the second fixture's port, given
/// as `?other=`: the page's process).
const FRAMED: &str = r#"<!doctype html><html><head><title>Framed</title></head><body>
<p>Outer words</p><button onclick="document.querySelectorAll('iframe').forEach(f => f.remove())">Drop frames</button>
<iframe title="Inner form" src="/inner" style="position:absolute;left:300px;top:150px;width:400px;height:160px;border:7px solid;padding:30px"></iframe>
<iframe title="Elsewhere" src="http://localhost:__PORT__/inner" style="position:absolute;left:300px;top:400px;width:400px;height:100px"></iframe>
<iframe title="Next door" src="http://127.0.0.1:__OTHER__/inner" style="position:absolute;left:300px;top:520px;width:400px;height:100px;border:0;padding:11px"></iframe>
</body></html>"#;

/// A payment provider's frame of another site (the fixture by the name `localhost`) holding
/// two forms of other origins: one of the page's site (a process apart from the provider's
/// frame) and one of the provider's site on another port (the provider frame's process); the
/// second fixture's port is given as `?other=`. Each frame has its own border and padding.
const NESTED: &str = r#"<!doctype html><html><head><title>Nested</title></head><body>
<button onclick="document.querySelector('iframe').remove()">Drop provider</button>
<iframe title="Payment" src="http://localhost:__PORT__/middle?other=__OTHER__" style="position:absolute;left:100px;top:80px;width:700px;height:440px;border:5px solid;padding:10px"></iframe>
</body></html>"#;

/// The payment provider's frame of [`NESTED`].
const MIDDLE: &str = r#"<!doctype html><html><head><title>Middle</title></head><body style="margin:0">
<p>Middle words</p>
<iframe title="Bank" src="http://127.0.0.1:__OTHER__/inner" style="position:absolute;left:20px;top:40px;width:600px;height:150px;border:3px solid;padding:4px"></iframe>
<iframe title="Card" src="http://localhost:__OTHER__/inner" style="position:absolute;left:30px;top:230px;width:600px;height:150px;border:0;padding:9px"></iframe>
</body></html>"#;

/// The framed form: what it is given and sent goes to `/typed`.
const INNER: &str = r#"<!doctype html><html><head><title>Inner</title></head><body style="margin:0">
<p>Inner words</p><input placeholder="inner name">
<button onclick="fetch('/typed?v=inner-' + document.querySelector('input').value)">Inner send</button>
<button onclick="alert('From ' + location.host)">Inner alert</button><a href="/inner?again">Again</a>
</body></html>"#;

/// A page with a frame of another site whose script keeps its process busy for 5 s.
const BUSY: &str = r#"<!doctype html><html><head><title>Busy</title></head><body>
<button>Still here</button>
<iframe title="Spinner" src="http://localhost:__PORT__/spin"></iframe></body></html>"#;

/// The busy frame.
const SPIN: &str = "<!doctype html><p>spinning</p><script>const end = Date.now() + 5000; while (Date.now() < end) {}</script>";

/// A page built of web components: its form lives in a component's open shadow root, with
/// its style, and a button in a component inside that one.
const COMPONENTS: &str = r#"<!doctype html><html><head><title>Components</title></head><body>
<script>customElements.define('sign-up', class extends HTMLElement {
  constructor() { super(); const root = this.attachShadow({ mode: 'open' });
    root.innerHTML = '<style>p { color: teal }</style><p>Shadow words</p><input placeholder="email"><button>Join</button><more-help></more-help>';
    root.querySelector('button').onclick = () => fetch('/typed?v=joined-' + root.querySelector('input').value); }
});
customElements.define('more-help', class extends HTMLElement {
  constructor() { super(); this.attachShadow({ mode: 'open' }).innerHTML = '<button>Deeper</button>'; }
});</script><sign-up></sign-up></body></html>"#;

/// A fixture site on 127.0.0.1:0 that records the values posted to `/typed`.
async fn fixture() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let port = listener.local_addr().unwrap().port().to_string();
    let typed = Arc::new(Mutex::new(Vec::new()));
    let seen = typed.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (seen, port) = (seen.clone(), port.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                if let Some(v) = path.strip_prefix("/typed?v=") {
                    let value = v.replace("%20", " ").replace("%21", "!");
                    seen.lock().unwrap().push(value);
                }
                if path == "/slow" {
                    // A page whose server answers late.
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                let other = path.split_once("?other=").map_or("", |(_, o)| o);
                let framed = FRAMED
                    .replace("__PORT__", &port)
                    .replace("__OTHER__", other);
                let nested = NESTED
                    .replace("__PORT__", &port)
                    .replace("__OTHER__", other);
                let middle = MIDDLE.replace("__OTHER__", other);
                let busy = BUSY.replace("__PORT__", &port);
                let body = match path.split('?').next().unwrap_or_default() {
                    "/framed" => framed.as_str(),
                    "/nested" => nested.as_str(),
                    "/middle" => middle.as_str(),
                    "/inner" => INNER,
                    "/components" => COMPONENTS,
                    "/busy" => busy.as_str(),
                    "/spin" => SPIN,
                    "/" => PAGE,
                    "/slow" => "<!doctype html><title>Slow</title><p>late</p>",
                    "/form" => FORM,
                    "/liar" => LIAR,
                    "/first" => FIRST,
                    "/second" => SECOND,
                    "/dialogs" => DIALOGS,
                    "/welcome" => WELCOME,
                    "/unsaved" => UNSAVED,
                    "/choose" => CHOOSE,
                    "/upload" => UPLOAD,
                    "/files" => FILES,
                    "/report" => REPORT,
                    _ => "ok",
                };
                let kind = if path == "/report" {
                    "text/csv\r\ncontent-disposition: attachment; filename=report.csv"
                } else {
                    "text/html"
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    (url, typed)
}

/// A tool call that must succeed; its result.
async fn tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    called(s, run, fence, name, arguments, false).await
}

/// A tool call's result, asserted to be an error or not as `failing` says.
async fn called(
    s: &TestServer,
    run: &str,
    fence: i64,
    name: &str,
    arguments: Value,
    failing: bool,
) -> Value {
    let r = s
        .ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
        )
        .await;
    assert_eq!(r["isError"], failing, "{name}: {r}");
    r
}

/// A server on the host `desktop` provider, the fixture site, one Team bot and its run.
async fn desktop_run() -> (
    TestServer,
    String,
    Arc<Mutex<Vec<String>>>,
    Vec<String>,
    String,
    i64,
) {
    common::capture_logs();
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap();
    let (site, typed) = fixture().await;
    let (_, bots) = s.space_with_bots(1, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    (s, site, typed, bots, run, fence)
}

/// Opens `url` in a new tab and takes page snapshots until one is of the page titled `title`
/// (the tab takes a moment to load); the last snapshot.
async fn open_and_snapshot(s: &TestServer, run: &str, fence: i64, url: &str, title: &str) -> Value {
    tool(s, run, fence, "open_path", json!({ "path": url })).await;
    snapshot_of(s, run, fence, title).await
}

/// Takes page snapshots until one is of the page titled `title`; the last snapshot.
async fn snapshot_of(s: &TestServer, run: &str, fence: i64, title: &str) -> Value {
    snapshot_titled(s, run, fence, &[title]).await
}

/// Takes page snapshots until one is of a page titled one of `titles`; the last snapshot.
async fn snapshot_titled(s: &TestServer, run: &str, fence: i64, titles: &[&str]) -> Value {
    let mut snap = Value::Null;
    for _ in 0..50 {
        snap = tool(s, run, fence, "browser_snapshot", json!({})).await;
        if titles
            .iter()
            .any(|t| snap["structuredContent"]["title"] == *t)
        {
            return snap;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the tools stayed on another page, not one of {titles:?}: {snap}");
}

/// The ref of the element named `name` in a page snapshot.
fn ref_named(snap: &Value, name: &str) -> String {
    snap["structuredContent"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no {name:?} in {snap}"))["ref"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The names of a snapshot's elements (its `structuredContent`), in order.
fn element_names(snap: &Value) -> Vec<&str> {
    snap["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect()
}

/// Clicks the element `reference` of the last page snapshot.
async fn click_ref(s: &TestServer, run: &str, fence: i64, reference: &str) {
    click_answer(s, run, fence, reference).await;
}

/// Clicks the element `reference` of the last page snapshot; the answer.
async fn click_answer(s: &TestServer, run: &str, fence: i64, reference: &str) -> Value {
    let args = json!({ "ref": reference, "action": "click" });
    tool(s, run, fence, "browser_act", args).await
}

#[actix_rt::test]
async fn a_scripted_agent_types_into_a_page_on_a_real_desktop() {
    let (s, site, typed, bots, run, fence) = desktop_run().await;

    let first = tool(&s, &run, fence, "computer_observe", json!({})).await;
    assert_eq!(
        (
            first["structuredContent"]["width"].as_u64(),
            first["structuredContent"]["height"].as_u64()
        ),
        (Some(1280), Some(800))
    );
    tool(&s, &run, fence, "open_path", json!({ "path": site })).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let batch = json!({ "actions": [
        { "type": "click", "x": 640, "y": 450 },
        { "type": "type", "text": "Hello Rakazo!" },
        { "type": "key", "keys": "Return" },
    ] });
    let acted = tool(&s, &run, fence, "computer_act", batch).await;
    assert_eq!(acted["structuredContent"]["completed"], 3);
    if let Some(img) = acted["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "image")
    {
        use base64::Engine;
        let png = base64::engine::general_purpose::STANDARD
            .decode(img["data"].as_str().unwrap())
            .unwrap();
        let _ = std::fs::write(std::env::temp_dir().join("agent-desktop-act.png"), png);
    }
    // A step the real screen refuses: its code and reason, in the result and its text.
    for (step, reason) in [
        (
            json!({ "type": "click", "x": 5000, "y": 10 }),
            "point (5000, 10) is outside the 1280x800 screen",
        ),
        (
            json!({ "type": "key", "keys": "ctrl+foo" }),
            "unknown key \"foo\"",
        ),
    ] {
        let bad = s
            .ok(
                "tools/call",
                json!({ "runId": run, "fence": fence, "name": "computer_act",
                        "arguments": { "actions": [{ "type": "move", "x": 5, "y": 5 }, step] } }),
            )
            .await;
        let error = &bad["structuredContent"]["error"];
        assert_eq!(
            (
                bad["isError"].as_bool(),
                error["code"].as_str(),
                error["reason"].as_str(),
                bad["structuredContent"]["completed"].as_u64()
            ),
            (Some(true), Some("INVALID_PARAMS"), Some(reason), Some(1)),
            "{bad}"
        );
        let text = bad["content"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with("INVALID_PARAMS: action 2 of 2") && text.contains(reason),
            "{text}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while typed.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        typed.lock().unwrap().last().map(String::as_str),
        Some("Hello Rakazo!")
    );

    // Page tools on the same visible browser: password values are masked, a ref made stale by
    // the page is refused rather than retargeted.
    tool(
        &s,
        &run,
        fence,
        "browser_navigate",
        json!({ "url": format!("{site}/form") }),
    )
    .await;
    let snap =
        tool(&s, &run, fence, "browser_snapshot", json!({})).await["structuredContent"].clone();
    assert_eq!(snap["title"], "Sign in");
    assert!(
        !snap.to_string().contains("hunter2"),
        "a password leaked: {snap}"
    );
    let elements = snap["elements"].as_array().unwrap();
    let by_name = |n: &str| {
        elements
            .iter()
            .find(|e| e["name"].as_str().unwrap_or("").contains(n))
            .unwrap()["ref"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (user, go) = (by_name("user name"), by_name("Go"));
    tool(
        &s,
        &run,
        fence,
        "browser_act",
        json!({ "ref": user, "action": "type", "text": "alice" }),
    )
    .await;
    click_ref(&s, &run, fence, &go).await;
    let stale = s
        .ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": "browser_act",
                                           "arguments": { "ref": go, "action": "click" } }),
        )
        .await;
    assert_eq!(
        stale["structuredContent"]["error"]["code"], "STALE_REF",
        "{stale}"
    );
    let after =
        tool(&s, &run, fence, "browser_snapshot", json!({})).await["structuredContent"].clone();
    let user_value = after["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "user name")
        .unwrap()["value"]
        .clone();
    assert_eq!(user_value, "alice");
    assert!(after["text"].as_str().unwrap().contains("Sign in"));

    // Shell and files on the same computer.
    tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "../../shared/plan.md", "content": "step 1\n" }),
    )
    .await;
    let out = tool(
        &s,
        &run,
        fence,
        "shell",
        json!({ "command": "cat ../../shared/plan.md && pwd" }),
    )
    .await;
    assert!(
        out["structuredContent"]["stdout"]
            .as_str()
            .unwrap()
            .starts_with("step 1\n")
    );
    let read = tool(
        &s,
        &run,
        fence,
        "read_file",
        json!({ "path": "/shared/plan.md" }),
    )
    .await;
    assert_eq!(read["structuredContent"]["content"], "step 1\n");
    let history = s.ok("activity.list", json!({ "botId": bots[0] })).await;
    let tools: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["shell", "write_file", "open_path"]);
}

#[actix_rt::test]
async fn page_tools_act_on_the_tab_on_the_screen() {
    let (s, site, typed, _, run, fence) = desktop_run().await;
    // The page tools attach to the liar's tab while it is on the screen...
    open_and_snapshot(&s, &run, fence, &format!("{site}/liar"), "Liar").await;
    // ... then the bot opens another tab, in front; the liar, now behind it, still says it
    // is visible to its own scripts.
    let snap = open_and_snapshot(&s, &run, fence, &format!("{site}/form"), "Sign in").await;
    let go = snap["structuredContent"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "Go")
        .unwrap()["ref"]
        .as_str()
        .unwrap()
        .to_owned();
    // A click on the tab on the screen reaches its page: the button is gone after it.
    click_ref(&s, &run, fence, &go).await;
    let after = tool(&s, &run, fence, "browser_snapshot", json!({})).await;
    let names = element_names(&after["structuredContent"]);
    assert_eq!(names, ["user name", "password", "Go again"], "{after}");
    assert!(
        typed.lock().unwrap().is_empty(),
        "the liar's button was pressed"
    );
}

#[actix_rt::test]
async fn page_tools_follow_the_document_through_navigation_and_history() {
    let (s, site, typed, _, run, fence) = desktop_run().await;
    let first = open_and_snapshot(&s, &run, fence, &format!("{site}/first"), "First").await;
    // A link followed in the tab: the tools speak to the new document.
    click_ref(&s, &run, fence, &ref_named(&first, "Second page")).await;
    let second = snapshot_of(&s, &run, fence, "Second").await;
    // A ref of the first page's snapshot names nothing on the second, though both pages have
    // an element at the same place in their snapshots: refused, and nothing is pressed.
    let mark = |page: &Value| json!({ "ref": ref_named(page, "Mark"), "action": "click" });
    let (code, message) = refused(&s, &run, fence, "browser_act", mark(&first)).await;
    assert_eq!(code, "STALE_REF", "{message}");
    // Back to the first page, shown again from the back-forward cache ("First again"; a
    // browser short of memory may load it anew instead): its document is the one the tools
    // read and act on, never the second's.
    click_ref(&s, &run, fence, &ref_named(&second, "Back")).await;
    let again = snapshot_titled(&s, &run, fence, &["First again", "First"]).await;
    click_ref(&s, &run, fence, &ref_named(&again, "Mark")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while typed.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*typed.lock().unwrap(), ["first"]);
    // The second page's refs are gone with its document.
    let (code, message) = refused(&s, &run, fence, "browser_act", mark(&second)).await;
    assert_eq!(code, "STALE_REF", "{message}");
    assert_eq!(*typed.lock().unwrap(), ["first"]);

    // A navigation answers once its page has loaded, however late its server answers: the
    // answer names the new page, never the one before it.
    let slow = tool(
        &s,
        &run,
        fence,
        "browser_navigate",
        json!({ "url": format!("{site}/slow") }),
    )
    .await;
    assert_eq!(slow["structuredContent"]["title"], "Slow", "{slow}");
    assert_eq!(slow["structuredContent"]["loaded"], true, "{slow}");
    // A navigation that fails says why.
    let refused = tool(
        &s,
        &run,
        fence,
        "browser_navigate",
        json!({ "url": "http://127.0.0.1:1/" }),
    )
    .await;
    assert_eq!(refused["structuredContent"]["loaded"], false, "{refused}");
    assert!(
        refused["structuredContent"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("ERR_")),
        "{refused}"
    );
}

/// Answers the page's open dialog: accepted or dismissed.
async fn dismiss_or_accept(s: &TestServer, run: &str, fence: i64, accept: bool) -> Value {
    tool(s, run, fence, "browser_dialog", json!({ "accept": accept })).await
}

/// A page tool call that must fail; its error's code and message.
async fn refused(
    s: &TestServer,
    run: &str,
    fence: i64,
    name: &str,
    arguments: Value,
) -> (String, String) {
    let r = called(s, run, fence, name, arguments, true).await;
    let error = &r["structuredContent"]["error"];
    (
        error["code"].as_str().unwrap().to_owned(),
        error["message"].as_str().unwrap().to_owned(),
    )
}

#[actix_rt::test]
async fn page_tools_answer_the_pages_dialogs() {
    let (s, site, _, _, run, fence) = desktop_run().await;
    let page = open_and_snapshot(&s, &run, fence, &format!("{site}/dialogs"), "Dialogs").await;

    // A click that opens a dialog is answered at once, naming the dialog.
    let args = json!({ "ref": ref_named(&page, "Confirm"), "action": "click" });
    let clicked = tool(&s, &run, fence, "browser_act", args).await;
    let dialog = &clicked["structuredContent"]["dialog"];
    assert_eq!(dialog["type"], "confirm", "{clicked}");
    assert_eq!(dialog["message"], "Delete it?", "{clicked}");
    // While it is open, the other page tools do nothing and say why.
    let (code, message) = refused(&s, &run, fence, "browser_snapshot", json!({})).await;
    assert_eq!(code, "PAGE_DIALOG_OPEN");
    assert!(
        message.contains("Delete it?") && message.contains("browser_dialog"),
        "{message}"
    );
    let args = json!({ "ref": ref_named(&page, "Prompt"), "action": "click" });
    let (code, _) = refused(&s, &run, fence, "browser_act", args).await;
    assert_eq!(code, "PAGE_DIALOG_OPEN");
    // Dismissed: the page's script goes on with the answer.
    let answered = dismiss_or_accept(&s, &run, fence, false).await;
    assert_eq!(
        answered["structuredContent"]["accepted"], false,
        "{answered}"
    );
    let page = snapshot_of(&s, &run, fence, "Kept").await;

    // A prompt, answered with text.
    let args = json!({ "ref": ref_named(&page, "Prompt"), "action": "click" });
    let clicked = tool(&s, &run, fence, "browser_act", args).await;
    assert_eq!(
        clicked["structuredContent"]["dialog"]["type"], "prompt",
        "{clicked}"
    );
    assert_eq!(
        clicked["structuredContent"]["dialog"]["defaultPrompt"],
        "nobody"
    );
    let args = json!({ "accept": true, "text": "Ann" });
    tool(&s, &run, fence, "browser_dialog", args).await;
    let page = snapshot_of(&s, &run, fence, "Hello Ann").await;

    // A dialog opened between two calls is found by the next one; answered on the screen
    // (as a person would, or the bot through the desktop tools), the page tools go on.
    let args = json!({ "ref": ref_named(&page, "Later"), "action": "click" });
    let clicked = tool(&s, &run, fence, "browser_act", args).await;
    assert!(
        clicked["structuredContent"]["dialog"].is_null(),
        "{clicked}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (code, message) = refused(&s, &run, fence, "browser_snapshot", json!({})).await;
    assert_eq!(code, "PAGE_DIALOG_OPEN");
    assert!(message.contains("Later"), "{message}");
    let key = json!({ "actions": [{ "type": "key", "keys": "Return" }] });
    tool(&s, &run, fence, "computer_act", key).await;
    snapshot_of(&s, &run, fence, "Alerted").await;
    // Nothing left to answer.
    let (code, _) = refused(&s, &run, fence, "browser_dialog", json!({ "accept": true })).await;
    assert_eq!(code, "PAGE_ACTION_FAILED");

    // A page that opens a dialog while it loads: the navigation answers with the dialog
    // instead of waiting out its load.
    let args = json!({ "url": format!("{site}/welcome") });
    let navigated = tool(&s, &run, fence, "browser_navigate", args).await;
    assert_eq!(
        navigated["structuredContent"]["loaded"], false,
        "{navigated}"
    );
    assert_eq!(
        navigated["structuredContent"]["dialog"]["message"],
        "Welcome aboard"
    );
    dismiss_or_accept(&s, &run, fence, true).await;
    let welcome = snapshot_of(&s, &run, fence, "Welcome").await;
    assert!(
        welcome["structuredContent"]["text"]
            .as_str()
            .unwrap()
            .contains("in")
    );
    // Leaving a page with a dialog open dismisses it, and the answer says so.
    let page = open_and_snapshot(&s, &run, fence, &format!("{site}/dialogs"), "Dialogs").await;
    let args = json!({ "ref": ref_named(&page, "Confirm"), "action": "click" });
    tool(&s, &run, fence, "browser_act", args).await;
    let args = json!({ "url": format!("{site}/first") });
    let left = tool(&s, &run, fence, "browser_navigate", args).await;
    assert_eq!(left["structuredContent"]["title"], "First", "{left}");
    assert_eq!(
        left["structuredContent"]["dismissedDialog"]["message"],
        "Delete it?"
    );

    // A link that leaves a page with unsaved changes: the page asks first. Dismissed, the bot
    // stays; accepted, it leaves.
    let page = open_and_snapshot(&s, &run, fence, &format!("{site}/unsaved"), "Unsaved").await;
    let note = json!({ "ref": ref_named(&page, "note"), "action": "click" });
    tool(&s, &run, fence, "browser_act", note).await;
    let leave = |page: &Value| json!({ "ref": ref_named(page, "Leave"), "action": "click" });
    let clicked = tool(&s, &run, fence, "browser_act", leave(&page)).await;
    assert_eq!(
        clicked["structuredContent"]["dialog"]["type"], "beforeunload",
        "{clicked}"
    );
    dismiss_or_accept(&s, &run, fence, false).await;
    let page = snapshot_of(&s, &run, fence, "Unsaved").await;
    let clicked = tool(&s, &run, fence, "browser_act", leave(&page)).await;
    assert_eq!(
        clicked["structuredContent"]["dialog"]["type"], "beforeunload",
        "{clicked}"
    );
    dismiss_or_accept(&s, &run, fence, true).await;
    snapshot_of(&s, &run, fence, "First").await;
}

#[actix_rt::test]
async fn a_navigation_to_a_file_answers_with_its_download() {
    let (s, site, _, _, run, fence) = desktop_run().await;
    open_and_snapshot(&s, &run, fence, &format!("{site}/first"), "First").await;
    let args = json!({ "url": format!("{site}/report") });
    let navigated = tool(&s, &run, fence, "browser_navigate", args).await;
    let download = &navigated["structuredContent"]["download"];
    assert_eq!(download["state"], "completed", "{navigated}");
    assert_eq!(download["suggestedFilename"], "report.csv", "{navigated}");
    assert_eq!(download["bytes"], REPORT.len(), "{navigated}");
    // Saved in the folder the answer names, where the bot's file tools read it; the page
    // the bot was on stays.
    let path = format!("{}/report.csv", download["folder"].as_str().unwrap());
    let read = tool(&s, &run, fence, "read_file", json!({ "path": path })).await;
    assert!(read.to_string().contains("january,12"), "{read}");
    snapshot_of(&s, &run, fence, "First").await;

    // A link to the file, clicked: the click, or the next page command, names the download
    // once it has begun and once it has ended.
    let files = open_and_snapshot(&s, &run, fence, &format!("{site}/files"), "Files").await;
    let mut told = vec![click_answer(&s, &run, fence, &ref_named(&files, "Report")).await];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !told
        .iter()
        .any(|t| t["structuredContent"]["download"]["state"] == "completed")
    {
        assert!(Instant::now() < deadline, "no download named: {told:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        told.push(snapshot_of(&s, &run, fence, "Files").await);
    }
    let named: Vec<&Value> = told
        .iter()
        .map(|t| &t["structuredContent"]["download"])
        .filter(|d| !d.is_null())
        .collect();
    assert_eq!(
        named.last().unwrap()["suggestedFilename"],
        "report.csv",
        "{named:?}"
    );
    // Each state is named once.
    assert!(named.len() <= 2, "{named:?}");
}

#[actix_rt::test]
async fn page_tools_choose_an_option_of_a_select() {
    let (s, site, typed, _, run, fence) = desktop_run().await;
    let page = open_and_snapshot(&s, &run, fence, &format!("{site}/choose"), "Choose").await;
    // The snapshot names the select by its label and lists its options.
    let fruit = page["structuredContent"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["tag"] == "select")
        .unwrap_or_else(|| panic!("no select in {page}"));
    assert_eq!(fruit["name"], "Fruit", "{fruit}");
    assert_eq!(fruit["options"][1]["label"], "Banana", "{fruit}");
    assert_eq!(fruit["options"][0]["selected"], true, "{fruit}");
    let reference = fruit["ref"].as_str().unwrap().to_owned();

    // Chosen by label: the page is told as by a person's choice.
    let args = json!({ "ref": reference, "action": "select", "text": "Banana" });
    let chosen = tool(&s, &run, fence, "browser_act", args).await;
    assert_eq!(chosen["structuredContent"]["value"], "b", "{chosen}");
    snapshot_of(&s, &run, fence, "Chose b").await;
    // An option the select does not have, or one that cannot be chosen, changes nothing.
    for missing in ["Durian", "Cherry"] {
        let page = snapshot_of(&s, &run, fence, "Chose b").await;
        let reference = ref_named(&page, "Fruit");
        let args = json!({ "ref": reference, "action": "select", "text": missing });
        let (code, message) = refused(&s, &run, fence, "browser_act", args).await;
        assert_eq!(code, "PAGE_ACTION_FAILED", "{message}");
        assert!(message.contains("nothing was done"), "{message}");
    }
    // By value, on the latest snapshot's ref.
    let page = snapshot_of(&s, &run, fence, "Chose b").await;
    let args = json!({ "ref": ref_named(&page, "Fruit"), "action": "select", "text": "a" });
    tool(&s, &run, fence, "browser_act", args).await;
    snapshot_of(&s, &run, fence, "Chose a").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while typed.lock().unwrap().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*typed.lock().unwrap(), ["b", "a"]);
}

/// Opens `url` (titled `title`) and snapshots it until `forms` framed forms ([`INNER`]) are
/// read: the frames load after the page. The last snapshot.
async fn snapshot_with_frames(
    s: &TestServer,
    run: &str,
    fence: i64,
    url: &str,
    title: &str,
    forms: usize,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut page = open_and_snapshot(s, run, fence, url, title).await;
    loop {
        let text = page["structuredContent"]["text"]
            .as_str()
            .unwrap_or_default();
        if text.matches("Inner words").count() == forms {
            return page;
        }
        assert!(Instant::now() < deadline, "the frames never loaded: {page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        page = snapshot_of(s, run, fence, title).await;
    }
}

/// Clicks the page's button `drop`, which takes frames out of the page: the send buttons of
/// the `forms` framed forms the snapshot before it listed are refused as stale (give a click
/// that slipped through time to reach its server before the caller counts).
async fn dropped_forms_are_stale(s: &TestServer, run: &str, fence: i64, drop: &str, forms: usize) {
    let page = tool(s, run, fence, "browser_snapshot", json!({})).await;
    let sends: Vec<String> = page["structuredContent"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "Inner send")
        .map(|e| e["ref"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sends.len(), forms, "{page}");
    click_ref(s, run, fence, &ref_named(&page, drop)).await;
    for send in sends {
        let args = json!({ "ref": send, "action": "click" });
        let (code, message) = refused(s, run, fence, "browser_act", args).await;
        assert_eq!(code, "STALE_REF", "{send}: {message}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[actix_rt::test]
async fn page_tools_read_and_act_in_frames_of_every_origin() {
    let (s, site, typed, _, run, fence) = desktop_run().await;
    let (next_door, typed_next_door) = fixture().await;
    let other = next_door.rsplit(':').next().unwrap();
    let url = format!("{site}/framed?other={other}");
    let page = snapshot_with_frames(&s, &run, fence, &url, "Framed", 3).await;
    let snap = &page["structuredContent"];
    let frames = snap["frames"].as_array().unwrap();
    let names: Vec<&str> = frames.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Inner form", "Elsewhere", "Next door"], "{snap}");
    assert!(frames[0].get("crossOrigin").is_none(), "{snap}");
    for frame in &frames[1..] {
        assert_eq!(frame["crossOrigin"], true, "{snap}");
        assert_eq!(frame["read"], true, "{snap}");
        assert!(frame["url"].as_str().unwrap().ends_with("/inner"), "{snap}");
    }
    let elements = snap["elements"].as_array().unwrap();
    for k in 0..3 {
        let names: Vec<&str> = elements
            .iter()
            .filter(|e| e["frame"] == k)
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["inner name", "Inner send", "Inner alert", "Again"],
            "frame {k}: {snap}"
        );
    }
    assert_eq!(elements.len(), 13, "{snap}");
    let text = snap["text"].as_str().unwrap();
    for k in 0..3 {
        assert!(
            text.contains(&format!("[frame {k}]\nInner words")),
            "{text}"
        );
    }
    assert!(text.starts_with("Outer words"), "{text}");

    // Typed into and clicked inside each frame: through the first's border and padding, in
    // the other site's process, and in the same site's other origin.
    let in_frame = |k: u64, name: &str| {
        elements
            .iter()
            .find(|e| e["frame"] == k && e["name"] == name)
            .unwrap()["ref"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for (k, word) in [(0, "deep"), (1, "far"), (2, "near")] {
        let args = json!({ "ref": in_frame(k, "inner name"), "action": "type", "text": word });
        tool(&s, &run, fence, "browser_act", args).await;
        click_ref(&s, &run, fence, &in_frame(k, "Inner send")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while (typed.lock().unwrap().len() < 2 || typed_next_door.lock().unwrap().is_empty())
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*typed.lock().unwrap(), ["inner-deep", "inner-far"]);
    assert_eq!(*typed_next_door.lock().unwrap(), ["inner-near"]);
    // A frame's dialog is named in the click's answer and answered, in every frame's process.
    for k in 0..3 {
        let clicked = click_answer(&s, &run, fence, &in_frame(k, "Inner alert")).await;
        let message = clicked["structuredContent"]["dialog"]["message"].as_str();
        assert!(
            message.is_some_and(|m| m.starts_with("From ")),
            "frame {k}: {clicked}"
        );
        dismiss_or_accept(&s, &run, fence, true).await;
    }

    // A frame of another origin that loads another document is read again at once, in its
    // process and in the page's.
    for k in [1, 2] {
        click_ref(&s, &run, fence, &in_frame(k, "Again")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = tool(&s, &run, fence, "browser_snapshot", json!({})).await;
        let frames = &page["structuredContent"]["frames"];
        for k in [1, 2] {
            assert!(frames[k].get("unread").is_none(), "{page}");
        }
        if (1..3).all(|k| {
            frames[k]["url"]
                .as_str()
                .is_some_and(|u| u.ends_with("?again"))
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the frames never loaded again: {page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Frames taken out of the page make their refs stale: nothing is clicked.
    dropped_forms_are_stale(&s, &run, fence, "Drop frames", 3).await;
    assert_eq!(typed.lock().unwrap().len(), 2);
    assert_eq!(typed_next_door.lock().unwrap().len(), 1);
}

/// Frames of other origins inside a frame of another site (a card form inside a payment
/// provider's frame): listed as in that frame, read in their own worlds (one in the page's
/// site's process, one in the provider's), typed into and clicked at the page's coordinates
/// through two frames' borders and paddings, their dialogs answered; the provider's frame taken
/// out of the page makes their refs stale.
#[actix_rt::test]
async fn page_tools_reach_frames_inside_a_frame_of_another_site() {
    let (s, site, _, _, run, fence) = desktop_run().await;
    let (next_door, typed_next_door) = fixture().await;
    let other = next_door.rsplit(':').next().unwrap();
    let url = format!("{site}/nested?other={other}");
    let page = snapshot_with_frames(&s, &run, fence, &url, "Nested", 2).await;
    let snap = &page["structuredContent"];
    let frames = snap["frames"].as_array().unwrap();
    let names: Vec<&str> = frames.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Payment", "Bank", "Card"], "{snap}");
    let provider = frames[0]["frame"].as_u64().unwrap();
    for frame in frames {
        assert_eq!(frame["crossOrigin"], true, "{snap}");
        assert_eq!(frame["read"], true, "{snap}");
    }
    for frame in &frames[1..] {
        assert_eq!(frame["in"], provider, "{snap}");
        assert!(frame["url"].as_str().unwrap().ends_with("/inner"), "{snap}");
    }
    let text = snap["text"].as_str().unwrap();
    assert!(text.contains("Middle words"), "{text}");
    let elements = snap["elements"].as_array().unwrap();
    let in_frame = |k: &Value, name: &str| {
        elements
            .iter()
            .find(|e| &e["frame"] == k && e["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in frame {k}: {snap}"))["ref"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for (frame, word) in [(&frames[1], "bank"), (&frames[2], "card")] {
        let k = &frame["frame"];
        let args = json!({ "ref": in_frame(k, "inner name"), "action": "type", "text": word });
        tool(&s, &run, fence, "browser_act", args).await;
        click_ref(&s, &run, fence, &in_frame(k, "Inner send")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while typed_next_door.lock().unwrap().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        *typed_next_door.lock().unwrap(),
        ["inner-bank", "inner-card"]
    );
    for frame in &frames[1..] {
        let clicked =
            click_answer(&s, &run, fence, &in_frame(&frame["frame"], "Inner alert")).await;
        let message = clicked["structuredContent"]["dialog"]["message"].as_str();
        assert!(message.is_some_and(|m| m.starts_with("From ")), "{clicked}");
        dismiss_or_accept(&s, &run, fence, true).await;
    }

    // The provider's frame taken out of the page: the refs inside it are stale.
    dropped_forms_are_stale(&s, &run, fence, "Drop provider", 2).await;
    assert_eq!(typed_next_door.lock().unwrap().len(), 2);
}

#[actix_rt::test]
async fn a_busy_frame_of_another_site_is_listed_unread_and_the_page_still_read() {
    let (s, site, _, _, run, fence) = desktop_run().await;
    let page = open_and_snapshot(&s, &run, fence, &format!("{site}/busy"), "Busy").await;
    let mut snap = page["structuredContent"].clone();
    // Until the frame's document arrives it shows its first, blank one (of the page's
    // origin): snapshots until it is the other site's.
    let deadline = Instant::now() + Duration::from_secs(20);
    while snap["frames"][0]["crossOrigin"] != true {
        assert!(Instant::now() < deadline, "no frame in {snap}");
        snap =
            tool(&s, &run, fence, "browser_snapshot", json!({})).await["structuredContent"].clone();
    }
    assert_eq!(snap["frames"][0]["unread"], true, "{snap}");
    assert_eq!(element_names(&snap), ["Still here"], "{snap}");
}

#[actix_rt::test]
async fn page_tools_reach_into_web_components() {
    let (s, site, typed, _, run, fence) = desktop_run().await;
    let url = format!("{site}/components");
    let page = open_and_snapshot(&s, &run, fence, &url, "Components").await;
    let snap = &page["structuredContent"];
    let text = snap["text"].as_str().unwrap();
    assert!(text.contains("Shadow words"), "{snap}");
    assert!(
        !text.contains("teal"),
        "a component's style is not text: {snap}"
    );
    assert_eq!(element_names(snap), ["email", "Join", "Deeper"], "{snap}");
    let args = json!({ "ref": ref_named(&page, "email"), "action": "type", "text": "ada" });
    tool(&s, &run, fence, "browser_act", args).await;
    click_ref(&s, &run, fence, &ref_named(&page, "Join")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while typed.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*typed.lock().unwrap(), ["joined-ada"]);
}

#[actix_rt::test]
async fn page_tools_upload_a_workspace_file_into_a_file_input() {
    let (s, site, _, _, run, fence) = desktop_run().await;
    let notes = json!({ "path": "notes.txt", "content": "hello" });
    tool(&s, &run, fence, "write_file", notes).await;
    let page = open_and_snapshot(&s, &run, fence, &format!("{site}/upload"), "Upload").await;
    let upload = |page: &Value, name: &str, file: &str| json!({ "ref": ref_named(page, name), "action": "upload", "text": file });
    // A path that leaves the workspace, a missing file (also one whose name begins another's),
    // a link, a folder and an element that takes no file are refused, and nothing reaches the
    // page.
    let link = json!({ "command": "ln -s /etc/hostname link.txt && mkdir folder" });
    tool(&s, &run, fence, "shell", link).await;
    for (element, file, want) in [
        ("Attachment", "../../../etc/passwd", "PATH_REJECTED"),
        ("Attachment", "missing.txt", "NOT_FOUND"),
        ("Attachment", "notes", "NOT_FOUND"),
        ("Attachment", "link.txt", "PATH_REJECTED"),
        ("Attachment", "folder", "PATH_REJECTED"),
        ("Send", "notes.txt", "PAGE_ACTION_FAILED"),
    ] {
        let args = upload(&page, element, file);
        let (code, message) = refused(&s, &run, fence, "browser_act", args).await;
        assert_eq!(code, want, "{file}: {message}");
    }
    snapshot_of(&s, &run, fence, "Upload").await;
    // The bot's own file, as its file tools name it, reaches the page.
    let page = snapshot_of(&s, &run, fence, "Upload").await;
    let done = tool(
        &s,
        &run,
        fence,
        "browser_act",
        upload(&page, "Attachment", "notes.txt"),
    )
    .await;
    assert_eq!(
        done["structuredContent"]["confirmed"][0], "files set",
        "{done}"
    );
    snapshot_of(&s, &run, fence, "Picked notes.txt 5").await;
}
