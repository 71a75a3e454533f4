//! A bot plants links, hard links and a fifo in its workspace on the host `desktop` provider
//! and asks the API for what they point to: the Files window (`files.read`, `files.list`,
//! `files.upload`) and the file tools (`tools/call` `read_file`, `list_files`, `write_file`)
//! answer `PATH_REJECTED`, while the computer runs and after it stopped, and the checkpoint
//! taken at stop neither hangs on the fifo nor follows a link.

mod common;

use common::{Backend, CallResult, TestServer};
use serde_json::{Value, json};

/// The error code of a refused call.
fn code(result: &CallResult) -> &str {
    match result {
        Err((_, code, _)) => code,
        Ok(v) => panic!("answered {v}"),
    }
}

/// The error code of a tool result (tools answer errors as `isError` results).
fn tool_code(result: &Value) -> &str {
    assert_eq!(result["isError"], true, "{result}");
    result["structuredContent"]["error"]["code"]
        .as_str()
        .unwrap()
}

/// Paths through or to the plants, none of which may be read.
const THROUGH: &[&str] = &[
    "up/content.key",
    "up/operator-token",
    "esc/passwd",
    "root/etc/passwd",
    "self/environ",
    "pipe",
    "hardkey",
    "up",
];

/// Folders that are links, none of which may be listed.
const LINKED_DIRS: &[&str] = &["up", "esc", "root", "self"];

#[actix_rt::test]
async fn planted_links_are_refused_live_and_stopped() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_PROVIDER", "desktop")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = bots[0].clone();
    let escape_name = format!("rakazo-escape-{}.txt", uuid::Uuid::new_v4().simple());
    let (run, fence) = s.start_run(&bot).await;
    let planted = s
        .exec(
            &run,
            fence,
            "echo mine > mine.txt; ln -s ../.. up; ln -s /etc esc; ln -s / root; \
             ln -s /proc/self self; ln -s /tmp uploads; mkfifo pipe; \
             ln ../../content.key hardkey; ls -la",
        )
        .await
        .unwrap();
    assert_eq!(planted["exitCode"], 0, "{planted}");
    let key = std::fs::read(s.app.config.data_dir.join("content.key")).unwrap();
    let leaks = |v: &Value| {
        let text = v.to_string();
        text.contains("root:x:0:0")
            || text.contains(&String::from_utf8_lossy(&key).trim().to_string())
    };

    // Live: the Files window.
    for path in THROUGH {
        let r = s
            .call("files.read", json!({ "botId": bot, "path": path }))
            .await;
        assert_eq!(code(&r), "PATH_REJECTED", "files.read {path}");
    }
    for path in LINKED_DIRS {
        let r = s
            .call("files.list", json!({ "botId": bot, "path": path }))
            .await;
        assert_eq!(code(&r), "PATH_REJECTED", "files.list {path}");
    }
    let root = s
        .ok("files.list", json!({ "botId": bot, "path": "" }))
        .await;
    assert_eq!(root["live"], true);
    let kind = |name: &str| {
        root["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed"))["kind"]
            .clone()
    };
    for link in ["up", "esc", "root", "self", "uploads"] {
        assert_eq!(kind(link), "link", "{link}");
    }
    assert_eq!(kind("pipe"), "other");
    // The hard link to the master key was made: a file of two names.
    assert_eq!(kind("hardkey"), "file");
    assert_eq!(
        s.ok("files.read", json!({ "botId": bot, "path": "mine.txt" }))
            .await["text"],
        "mine\n"
    );

    // Live: the file tools.
    let tool = |name: &'static str, arguments: Value| {
        let (s, run) = (&s, run.clone());
        async move {
            s.ok(
                "tools/call",
                json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
            )
            .await
        }
    };
    for path in THROUGH {
        let r = tool("read_file", json!({ "path": path })).await;
        assert!(!leaks(&r), "read_file {path}: {r}");
        assert_eq!(tool_code(&r), "PATH_REJECTED", "read_file {path}");
    }
    for path in LINKED_DIRS {
        let r = tool("list_files", json!({ "path": path })).await;
        assert_eq!(tool_code(&r), "PATH_REJECTED", "list_files {path}");
    }
    for path in [
        format!("root/tmp/{escape_name}"),
        format!("uploads/{escape_name}"),
        "hardkey".to_owned(),
        "pipe".to_owned(),
    ] {
        let r = tool(
            "write_file",
            json!({ "path": path, "content": "overwritten" }),
        )
        .await;
        assert_eq!(tool_code(&r), "PATH_REJECTED", "write_file {path}");
    }
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;

    // Live: an upload lands in `uploads/`, a link to /tmp here.
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let r = s
        .call(
            "files.upload",
            json!({ "botId": bot, "name": escape_name, "contentBase64": "eA==" }),
        )
        .await;
    assert_eq!(code(&r), "PATH_REJECTED", "files.upload through a link");
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    assert!(!std::path::Path::new("/tmp").join(&escape_name).exists());
    assert_eq!(
        std::fs::read(s.app.config.data_dir.join("content.key")).unwrap(),
        key
    );

    // Stopped: the checkpoint at stop neither hangs on the fifo nor follows a link, and the
    // stored copy is browsed under the same rules.
    let computer = s.ok("computer.forBot", json!({ "botId": bot })).await["id"].clone();
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        s.ok("computer.stop", json!({ "computerId": computer })),
    )
    .await
    .expect("the stop's checkpoint hung");
    for path in THROUGH {
        let r = s
            .call("files.read", json!({ "botId": bot, "path": path }))
            .await;
        assert_eq!(code(&r), "PATH_REJECTED", "stopped files.read {path}");
    }
    for path in LINKED_DIRS {
        let r = s
            .call("files.list", json!({ "botId": bot, "path": path }))
            .await;
        assert_eq!(code(&r), "PATH_REJECTED", "stopped files.list {path}");
    }
    let stored = s
        .ok("files.read", json!({ "botId": bot, "path": "mine.txt" }))
        .await;
    assert_eq!(
        (&stored["live"], &stored["text"]),
        (&json!(false), &json!("mine\n"))
    );
    let listed = s
        .ok("files.list", json!({ "botId": bot, "path": "" }))
        .await;
    assert_eq!(listed["live"], false);
    assert!(!leaks(&listed));
}
