//! Checkpoints keep browsers open: with a person's view connected, a run's checkpoint leaves
//! the bot's Chromium running (same process, the viewer still attached) and stores its cookies
//! (a revision restored without Chromium's own cookie database gives them back to the next
//! browser), and a second checkpoint with no change in between stores nothing, on the host's
//! `desktop` provider and on Docker computers.

mod common;
mod docker_support;

use std::time::{Duration, Instant};

use common::{Backend, TestServer};
use futures_util::StreamExt;
use rakazo::config::DockerNetwork;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

use docker_support::{TestSupervisor, docker_ready};

/// A site run inside the computer on a loopback port of its own choosing: `/set/<v>` sets the
/// cookie `kept=<v>`; every request is logged with the cookie header it carried. Its files
/// live outside the workspace, so serving changes nothing a checkpoint stores. It exits after
/// five minutes without a request, so a failed test leaves no server behind on the host.
const SITE: &str = r#"import http.server, os, sys
DIR = sys.argv[1]
LOG = os.path.join(DIR, "seen.log")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        parts = self.path.strip("/").split("/")
        self.send_response(200)
        if parts[0] == "set":
            self.send_header("Set-Cookie", "kept=%s; Path=/; Max-Age=86400" % parts[1])
        body = b"<html><head><title>site</title></head><body>site</body></html>"
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        with open(LOG, "a") as f:
            f.write("%s %s\n" % (self.path, self.headers.get("Cookie", "-")))
    def log_message(self, *a):
        pass
class Server(http.server.ThreadingHTTPServer):
    timeout = 300
    idle = False
    def handle_timeout(self):
        self.idle = True
server = Server(("127.0.0.1", 0), H)
with open(os.path.join(DIR, "port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(DIR, "port.tmp"), os.path.join(DIR, "port"))
while not server.idle:
    server.handle_request()
"#;

async fn tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    let r = s
        .ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
        )
        .await;
    assert_eq!(r["isError"], false, "{name}: {r}");
    r
}

async fn sh(s: &TestServer, run: &str, fence: i64, script: &str) -> String {
    let out = s.exec(run, fence, script).await.unwrap();
    assert_eq!(out["exitCode"], 0, "{script}: {out}");
    out["stdout"].as_str().unwrap_or_default().to_owned()
}

/// Starts the site in the computer; returns its directory and port.
async fn start_site(s: &TestServer, run: &str, fence: i64) -> (String, u16) {
    let dir = format!("/tmp/rakazo-site-{}", uuid::Uuid::new_v4().simple());
    let script = format!(
        "mkdir -p {dir} && cat > {dir}/site.py <<'PY'\n{SITE}PY\n\
         setsid python3 {dir}/site.py {dir} >/dev/null 2>&1 </dev/null &\n\
         for i in $(seq 100); do [ -f {dir}/port ] && cat {dir}/port && exit 0; sleep 0.1; done; exit 1"
    );
    let port = sh(s, run, fence, &script).await.trim().parse().unwrap();
    (dir, port)
}

/// Opens `path` of the site in the bot's browser and waits until the site saw it; returns
/// the cookie header the browser sent.
async fn visit(s: &TestServer, run: &str, fence: i64, site: &(String, u16), path: &str) -> String {
    let (dir, port) = site;
    for _attempt in 0..3 {
        tool(
            s,
            run,
            fence,
            "open_path",
            json!({ "path": format!("http://127.0.0.1:{port}{path}") }),
        )
        .await;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let log = sh(
                s,
                run,
                fence,
                &format!("cat {dir}/seen.log 2>/dev/null; true"),
            )
            .await;
            if let Some(line) = log.lines().find(|l| l.split(' ').next() == Some(path)) {
                return line.split_once(' ').unwrap().1.to_owned();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    panic!("the browser never reached {path}");
}

/// The pid of the bot's main browser process, seen inside the computer.
async fn browser_pid(s: &TestServer, run: &str, fence: i64, bot: &str) -> String {
    sh(
        s,
        run,
        fence,
        &format!("pgrep -o -f -- 'chromium.*browser-profiles/{bot}/' || pgrep -o -f -- 'browser-profiles/{bot}/'"),
    )
    .await
    .trim()
    .to_owned()
}

/// Waits until no archived file of the profile changed for ten seconds (at most a minute).
/// Waits until no file of `profile` that a checkpoint keeps changed for `window`.
async fn quiet(s: &TestServer, run: &str, fence: i64, profile: &str, window: Duration) {
    let transient = rakazo::stores::archive::TRANSIENT
        .iter()
        .map(|n| format!("-name '{n}'"))
        .collect::<Vec<_>>()
        .join(" -o ");
    let script = format!(
        "find '{profile}' \\( {transient} \\) -prune -o -newermt '-{} seconds' -print -quit",
        window.as_secs()
    );
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(180) {
        if sh(s, run, fence, &script).await.trim().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn finish(s: &TestServer, run: &str, fence: i64) -> Value {
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await["checkpoint"]
        .clone()
}

async fn a_checkpoint_keeps_a_watched_browser_and_its_cookies(s: &TestServer, docker: bool) {
    let (space, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    tool(s, &run, fence, "computer_observe", json!({})).await;
    let _cleanup =
        docker.then(|| docker_support::RemoveOnDrop(docker_support::space_container(&space)));

    // A person watches the bot's screen.
    let view = s.ok("computer.screenUrl", json!({ "botId": bot })).await;
    let path = view["url"]
        .as_str()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .replace("/vnc.html", "/websockify");
    let mut request = format!("{}{path}", s.base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "binary".parse().unwrap());
    let (mut viewer, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let greeting = tokio::time::timeout(Duration::from_secs(10), viewer.next())
        .await
        .expect("an RFB greeting");
    assert!(
        matches!(&greeting, Some(Ok(Message::Binary(b))) if b.starts_with(b"RFB ")),
        "{greeting:?}"
    );

    let site = start_site(s, &run, fence).await;
    let marker = uuid::Uuid::new_v4().simple().to_string();
    visit(s, &run, fence, &site, &format!("/set/{marker}")).await;
    let pid = browser_pid(s, &run, fence, bot).await;
    assert!(!pid.is_empty());
    let profile = sh(
        s,
        &run,
        fence,
        &format!("tr '\\0' '\\n' < /proc/{pid}/cmdline | sed -n 's/^--user-data-dir=//p'"),
    )
    .await
    .trim()
    .to_owned();
    assert!(profile.ends_with(&format!("/{bot}/")), "{profile}");
    // Chromium writes its history and local storage for up to a minute after a visit, and
    // its preferences at set times after its start (password store metrics at about 30 s,
    // credential clean-ups at about 60 s): those are changes of their own, for the first
    // checkpoint to store. A settled browser then writes nothing the archive keeps.
    quiet(s, &run, fence, &profile, Duration::from_secs(35)).await;

    let first = finish(s, &run, fence).await;
    let saved = first["saved"].as_i64().expect("a revision");
    assert_ne!(first["unchanged"], true, "{first}");

    // The same browser runs on, and the person still watches it.
    let (run, fence) = s.start_run(bot).await;
    assert_eq!(
        browser_pid(s, &run, fence, bot).await,
        pid,
        "the browser was restarted"
    );
    let closed = tokio::time::timeout(Duration::from_millis(500), viewer.next()).await;
    assert!(
        !matches!(
            closed,
            Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_))))
        ),
        "the viewer was disconnected: {closed:?}"
    );
    // A second checkpoint keeps the same browser too, and with nothing changed it stores
    // nothing.
    let second = finish(s, &run, fence).await;
    assert_eq!(second["unchanged"], true, "{second}");
    assert_eq!(second["saved"].as_i64(), Some(saved), "{second}");
    let (run, fence) = s.start_run(bot).await;
    assert_eq!(browser_pid(s, &run, fence, bot).await, pid);
    finish(s, &run, fence).await;
    drop(viewer);

    // The first revision holds the cookie: restored (without Chromium's own cookie database,
    // which the archive leaves out), the next browser has it.
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    s.ok(
        "computer.restoreRevision",
        json!({ "computerId": c["id"], "revision": saved }),
    )
    .await;
    let (run, fence) = s.start_run(bot).await;
    let listing = sh(
        s,
        &run,
        fence,
        &format!("ls '{profile}' '{profile}Default/'"),
    )
    .await;
    assert!(listing.contains("Saved Cookies.json"), "{listing}");
    tool(s, &run, fence, "computer_observe", json!({})).await;
    let site = start_site(s, &run, fence).await;
    let sent = visit(s, &run, fence, &site, "/check").await;
    assert!(
        sent.contains(&format!("kept={marker}")),
        "the restored browser sent {sent:?}"
    );
    finish(s, &run, fence).await;
}

#[actix_rt::test]
async fn desktop_checkpoints_keep_a_watched_browser_and_its_cookies() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap();
    a_checkpoint_keeps_a_watched_browser_and_its_cookies(&s, false).await;
}

#[actix_rt::test]
async fn docker_checkpoints_keep_a_watched_browser_and_its_cookies() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::Bridge);
    let s = TestServer::docker(&sup.url, &sup.token).await;
    a_checkpoint_keeps_a_watched_browser_and_its_cookies(&s, true).await;
}
