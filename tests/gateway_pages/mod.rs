//! The page tools on a computer whose sockets the API cannot dial (remote vendors, Kubernetes
//! pods), against a page served inside the computer.

use std::time::Duration;

use rakazo_actors::provider::{
    BrowserCommand, ExecRequest, MachineSpec, ProviderRef, SandboxProvider,
};

/// DevTools goes through the sandbox's screen gateway (the vendor's port address, through the
/// loopback forwarder) on a bridge of its own token. A page served inside the sandbox is
/// opened, read and clicked (the click opens a dialog, named and answered), a workspace file
/// is uploaded into it, a button in a frame of another site is clicked, and one in a frame of
/// a third site inside that frame; the tools follow a second tab the bot opens.
pub async fn through_the_gateway(p: &dyn SandboxProvider, name: &str) {
    assert!(p.describe().capabilities.page_browser);
    let spec = MachineSpec {
        computer_id: format!("c-pages-{name}"),
        space_id: "s1".into(),
        bot_id: None,
        home_key: format!("h-pages-{name}"),
    };
    let machine = p.provision(&spec).await.unwrap();
    let page = r#"<!doctype html><title>Inside</title><button onclick="this.textContent = confirm('Sure?') ? 'Done' : 'Not'">Go</button><input type="file" aria-label="Attachment" onchange="document.title = 'Picked ' + this.files[0].size"><iframe title="Other site" src="http://127.0.0.2:8123/inner.html" style="width:300px;height:80px"></iframe>"#;
    p.write_file(&machine, "site/index.html", page.as_bytes())
        .await
        .unwrap();
    let inner = r#"<!doctype html><title>Inner</title><button onclick="this.textContent = 'Pressed'">Inner</button><iframe title="Third site" src="http://127.0.0.3:8123/deep.html" style="width:200px;height:40px"></iframe>"#;
    let deep = r#"<!doctype html><title>Deep</title><button onclick="this.textContent = 'Deeper'">Deep</button>"#;
    for (file, html) in [("site/inner.html", inner), ("site/deep.html", deep)] {
        p.write_file(&machine, file, html.as_bytes()).await.unwrap();
    }
    let serve = ExecRequest {
        command: "setsid nohup python3 -m http.server 8123 --bind 0.0.0.0 --directory site \
                  >/dev/null 2>&1 </dev/null & for i in $(seq 50); do \
                  python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8123))' \
                  2>/dev/null && exit 0; sleep 0.1; done; exit 1"
            .into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    };
    let served = p.exec(&machine, &serve).await.unwrap();
    assert_eq!(served.exit_code, 0, "{served:?}");
    p.open_screen(&machine, "bot-1", 0).await.unwrap();

    let url = "http://127.0.0.1:8123/".to_owned();
    let opened = p
        .browser(
            &machine,
            "bot-1",
            &BrowserCommand::Navigate { url: url.clone() },
        )
        .await
        .unwrap();
    assert_eq!(opened["title"], "Inside", "{opened}");
    let snapshot = p
        .browser(&machine, "bot-1", &BrowserCommand::Snapshot)
        .await
        .unwrap();
    let go = snapshot["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "Go")
        .unwrap_or_else(|| panic!("no button in {snapshot}"))["ref"]
        .as_str()
        .unwrap()
        .to_owned();
    let act = BrowserCommand::Act {
        element: go,
        action: "click".into(),
        text: None,
    };
    let clicked = p.browser(&machine, "bot-1", &act).await.unwrap();
    assert_eq!(clicked["dialog"]["message"], "Sure?", "{clicked}");
    let answer = BrowserCommand::Dialog {
        accept: true,
        text: None,
    };
    p.browser(&machine, "bot-1", &answer).await.unwrap();
    let after = p
        .browser(&machine, "bot-1", &BrowserCommand::Snapshot)
        .await
        .unwrap();
    assert_eq!(after["elements"][0]["name"], "Done", "{after}");
    // A workspace file reaches a file input from the workspace as the computer sees it.
    p.write_file(&machine, "notes.txt", b"hello").await.unwrap();
    let upload = BrowserCommand::Act {
        element: after["elements"][1]["ref"].as_str().unwrap().to_owned(),
        action: "upload".into(),
        text: Some("notes.txt".into()),
    };
    p.browser(&machine, "bot-1", &upload).await.unwrap();
    let picked = p
        .browser(&machine, "bot-1", &BrowserCommand::Snapshot)
        .await
        .unwrap();
    assert_eq!(picked["title"], "Picked 5", "{picked}");
    // A frame of another site, in a process of its own, is read and clicked through DevTools.
    let in_frame = |snapshot: &serde_json::Value, frame: u64, name: &str| {
        snapshot["elements"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["frame"] == frame && e["name"] == name)
            .map(|e| e["ref"].as_str().unwrap().to_owned())
    };
    let press = |element: String| BrowserCommand::Act {
        element,
        action: "click".into(),
        text: None,
    };
    let inner = in_frame(&picked, 0, "Inner").unwrap_or_else(|| panic!("no frame in {picked}"));
    p.browser(&machine, "bot-1", &press(inner)).await.unwrap();
    // The third site's frame, inside the other site's (it may load after it).
    let pressed = snapshot_until(p, &machine, |s| in_frame(s, 1, "Deep").is_some()).await;
    assert!(in_frame(&pressed, 0, "Pressed").is_some(), "{pressed}");
    assert_eq!(pressed["frames"][1]["in"], 0, "{pressed}");
    let deep = in_frame(&pressed, 1, "Deep").unwrap_or_else(|| panic!("no frame in {pressed}"));
    p.browser(&machine, "bot-1", &press(deep)).await.unwrap();
    let deeper = p
        .browser(&machine, "bot-1", &BrowserCommand::Snapshot)
        .await
        .unwrap();
    assert!(in_frame(&deeper, 1, "Deeper").is_some(), "{deeper}");

    // A tab the bot opens in front is the one the tools read next.
    p.open(&machine, "bot-1", &format!("{url}?second"))
        .await
        .unwrap();
    let seen = snapshot_until(p, &machine, |s| s["url"] == format!("{url}?second")).await;
    assert_eq!(seen["url"], format!("{url}?second"), "{seen}");
    p.destroy(&machine).await.unwrap();
}

/// Bot 1's page snapshot once `ready` holds of it, or the last one taken within 10 s.
async fn snapshot_until(
    p: &dyn SandboxProvider,
    machine: &ProviderRef,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut snapshot = serde_json::Value::Null;
    for _ in 0..50 {
        snapshot = p
            .browser(machine, "bot-1", &BrowserCommand::Snapshot)
            .await
            .unwrap();
        if ready(&snapshot) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    snapshot
}
