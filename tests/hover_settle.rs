//! A batch of pointer moves settles after the short pointer-only quiet window, and still
//! returns the frame the moves repainted: a real Xvfb, fluxbox and Chromium on a page whose
//! left half changes colour under the pointer (`:hover`).

#[path = "xvfb/mod.rs"]
mod xvfb;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::command::{HostRunner, sweep_script};
use rakazo::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};
use rakazo_actors::provider::{Action, FrameSize};
use xvfb::pixel;

/// Where the pointer goes on each half of the page (well below the browser's toolbars).
const LEFT: (i32, i32) = (300, 600);
const RIGHT: (i32, i32) = (1000, 600);
const BLUE: [u8; 3] = [0, 0, 255];
const RED: [u8; 3] = [255, 0, 0];

/// Ten moves ending at `to`, starting 90 pixels away.
fn moves_to(to: (i32, i32)) -> Vec<Action> {
    (0..10)
        .map(|i| Action::Move {
            x: to.0 - 90 + i * 10,
            y: to.1,
        })
        .collect()
}

#[tokio::test]
async fn pointer_moves_return_the_hover_repaint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
    let run_dir = dir.path().join("run");
    let settle = Settle::default();
    assert!(settle.pointer_quiet <= settle.quiet);
    let config = RuntimeConfig {
        settle,
        ..RuntimeConfig::on_host(
            dir.path().join("workspace"),
            run_dir.clone(),
            DisplayPool::new(410),
        )
    };
    let runtime = Arc::new(DesktopRuntime::new(Arc::new(HostRunner::minimal()), config));
    runtime.open_screen("hover", 0).await.expect("open screen");
    let page = "data:text/html,<style>body{margin:0}div{position:fixed;top:0;bottom:0;width:50%}\
        %23a{left:0;background:%2300f}%23a:hover{background:%23f00}%23b{right:0;background:%230f0}</style>\
        <div id=a></div><div id=b></div>";
    let go = [
        Action::Key {
            keys: "ctrl+l".into(),
        },
        Action::Wait { ms: 300 },
        Action::Type { text: page.into() },
        Action::Key {
            keys: "Return".into(),
        },
        Action::Move {
            x: RIGHT.0,
            y: RIGHT.1,
        },
    ];
    runtime.act("hover", &go).await.unwrap();
    // The page is up once its left half shows, not hovered.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let o = runtime.observe("hover").await.unwrap();
        if pixel(&o.frame.png, LEFT.0 as usize, LEFT.1 as usize) == BLUE {
            break;
        }
        assert!(Instant::now() < deadline, "the page never showed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    for round in 0..6 {
        let onto_left = runtime.act("hover", &moves_to(LEFT)).await.unwrap();
        assert_eq!(onto_left.completed, 10);
        assert_eq!(
            pixel(
                &onto_left.observation.frame.png,
                LEFT.0 as usize,
                LEFT.1 as usize
            ),
            RED,
            "round {round}: the act returned the frame with the hover repaint"
        );
        let away = runtime.act("hover", &moves_to(RIGHT)).await.unwrap();
        assert_eq!(
            pixel(
                &away.observation.frame.png,
                LEFT.0 as usize,
                LEFT.1 as usize
            ),
            BLUE,
            "round {round}: the hover ended in the returned frame"
        );
    }

    // The same with a scaled screenshot: the returned image is half size, its hovered half red.
    let half = FrameSize {
        max_width: Some(640),
        max_height: None,
    };
    let scaled = runtime
        .act_sized("hover", &moves_to(LEFT), half)
        .await
        .unwrap();
    let frame = &scaled.observation.frame;
    assert_eq!(
        (frame.width, frame.height, frame.screen),
        (640, 400, Some((1280, 800)))
    );
    assert_eq!(
        pixel(&frame.png, LEFT.0 as usize / 2, LEFT.1 as usize / 2),
        RED
    );

    runtime.shutdown().await.unwrap();
    let _ = std::process::Command::new("bash")
        .arg("-c")
        .arg(sweep_script(&format!("{}/", run_dir.display())))
        .status();
}
