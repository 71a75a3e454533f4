//! The provider conformance suite: one generic set of checks every `SandboxProvider` must
//! pass. A backend's test file instantiates it with [`conformance_suite!`], which turns each
//! check into its own test.
//!
//! Commands stay within a small POSIX subset (`echo`, `cat`, `exit`, `sleep`, redirections)
//! so that emulated shells and real ones answer alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::provider::{
    Action, Button, ExecRequest, MachineSpec, ProviderError, ProviderRef, SandboxProvider,
    WorkspaceExport,
};
use crate::workspace::Piece;

/// PNG file signature.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// A machine spec unique to one check.
pub fn spec(tag: &str) -> MachineSpec {
    let id = format!("conf-{tag}-{}", uuid::Uuid::new_v4().simple());
    MachineSpec {
        computer_id: id.clone(),
        space_id: "conformance".into(),
        bot_id: None,
        home_key: id,
    }
}

/// A command with a generous timeout.
pub fn cmd(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    }
}

async fn machine(p: &dyn SandboxProvider, tag: &str) -> ProviderRef {
    p.provision(&spec(tag)).await.expect("provision")
}

/// `describe()` names the provider kind.
pub async fn describes_itself(p: Arc<dyn SandboxProvider>) {
    assert!(!p.describe().kind.is_empty());
}

/// Commands run with output, errors and exit codes.
pub async fn exec_runs_commands(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "exec").await;
    let out = p.exec(&m, &cmd("echo hello")).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str(), out.timed_out),
        (0, "hello\n", false)
    );
    let out = p.exec(&m, &cmd("echo oops >&2")).await.unwrap();
    assert_eq!(out.stderr, "oops\n");
    let out = p.exec(&m, &cmd("exit 3")).await.unwrap();
    assert_eq!(out.exit_code, 3);
    let mut env = cmd("echo $RAKAZO_CONFORMANCE");
    env.env.push(("RAKAZO_CONFORMANCE".into(), "yes".into()));
    assert_eq!(p.exec(&m, &env).await.unwrap().stdout, "yes\n");
    p.destroy(&m).await.unwrap();
}

/// A command past its deadline is stopped and reported as timed out.
pub async fn exec_times_out(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "timeout").await;
    let mut req = cmd("sleep 30");
    req.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let out = p.exec(&m, &req).await.unwrap();
    assert!(out.timed_out, "the deadline must stop the command");
    assert!(started.elapsed() < Duration::from_secs(10));
    p.destroy(&m).await.unwrap();
}

/// Files written are read back and listed; shell and file tools see the same workspace.
pub async fn files_round_trip(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "files").await;
    p.write_file(&m, "notes/a.txt", b"alpha\n").await.unwrap();
    assert_eq!(p.read_file(&m, "notes/a.txt").await.unwrap(), b"alpha\n");
    let listed = p.list_files(&m, "notes").await.unwrap();
    let entry = listed.iter().find(|e| e.name == "a.txt").expect("listed");
    assert_eq!((entry.kind.as_str(), entry.size), ("file", 6));
    assert_eq!(
        p.exec(&m, &cmd("cat notes/a.txt")).await.unwrap().stdout,
        "alpha\n"
    );
    p.exec(&m, &cmd("echo beta > b.txt")).await.unwrap();
    assert_eq!(p.read_file(&m, "b.txt").await.unwrap(), b"beta\n");
    assert!(matches!(
        p.read_file(&m, "missing.txt").await,
        Err(ProviderError::NotFound(_))
    ));
    p.destroy(&m).await.unwrap();
}

/// Paths outside the workspace are refused.
pub async fn files_refuse_escapes(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "paths").await;
    for bad in ["../escape.txt", "/etc/passwd", "a/../../b", ""] {
        assert!(
            matches!(
                p.read_file(&m, bad).await,
                Err(ProviderError::PathRejected(_))
            ),
            "read of {bad:?} must be refused"
        );
        assert!(
            matches!(
                p.write_file(&m, bad, b"x").await,
                Err(ProviderError::PathRejected(_))
            ),
            "write of {bad:?} must be refused"
        );
    }
    p.destroy(&m).await.unwrap();
}

/// The whole workspace moves between machines through export and import.
pub async fn workspace_moves_between_machines(p: Arc<dyn SandboxProvider>) {
    let a = machine(p.as_ref(), "export").await;
    p.write_file(&a, "shared/report.md", b"# report\n")
        .await
        .unwrap();
    p.write_file(&a, ".browser-profiles/bot-1/Cookies", b"cookie-db")
        .await
        .unwrap();
    let archive = p.export_workspace(&a).await.unwrap();
    let b = machine(p.as_ref(), "import").await;
    p.write_file(&b, "stale.txt", b"old").await.unwrap();
    p.import_workspace(&b, &archive).await.unwrap();
    assert_eq!(
        p.read_file(&b, "shared/report.md").await.unwrap(),
        b"# report\n"
    );
    assert_eq!(
        p.read_file(&b, ".browser-profiles/bot-1/Cookies")
            .await
            .unwrap(),
        b"cookie-db"
    );
    assert!(matches!(
        p.read_file(&b, "stale.txt").await,
        Err(ProviderError::NotFound(_))
    ));
    p.destroy(&a).await.unwrap();
    p.destroy(&b).await.unwrap();
}

/// An export since a fingerprint the provider gave is skipped while nothing changes, and
/// never after a change, even one that keeps the file's size. A provider that gives no
/// fingerprint always exports.
pub async fn unchanged_workspace_is_not_exported_again(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "since").await;
    p.write_file(&m, "notes/a.txt", b"first").await.unwrap();
    let export = |since: Option<String>| {
        let (p, m) = (p.clone(), m.clone());
        async move {
            p.export_workspace_since(&m, since.as_deref())
                .await
                .unwrap()
        }
    };
    let fingerprint_of = |export: WorkspaceExport| match export {
        WorkspaceExport::Archive { fingerprint, .. } => fingerprint,
        WorkspaceExport::Unchanged => panic!("an export without a fingerprint must pack"),
    };
    let mut fingerprint = fingerprint_of(export(None).await);
    // A fingerprint does not vouch for a change too recent to be sure of: wait that out once.
    if fingerprint.is_some()
        && !matches!(
            export(fingerprint.clone()).await,
            WorkspaceExport::Unchanged
        )
    {
        tokio::time::sleep(Duration::from_millis(2100)).await;
        fingerprint = fingerprint_of(export(None).await);
    }
    let Some(fingerprint) = fingerprint else {
        p.destroy(&m).await.unwrap();
        return;
    };
    assert!(matches!(
        export(Some(fingerprint.clone())).await,
        WorkspaceExport::Unchanged
    ));
    p.write_file(&m, "notes/a.txt", b"other").await.unwrap();
    match export(Some(fingerprint.clone())).await {
        WorkspaceExport::Archive {
            workspace,
            fingerprint: after,
            ..
        } => {
            assert_ne!(after.as_deref(), Some(fingerprint.as_str()));
            // Unchanged pieces may be named by stamp only; the changed bytes travel.
            let carries_change = workspace.pieces.iter().any(|piece| match piece {
                Piece::Bytes { bytes, .. } => bytes.windows(5).any(|w| w == b"other"),
                Piece::Same { .. } => false,
            });
            assert!(carries_change, "the changed file is not in the export");
            let archive = p.export_workspace(&m).await.unwrap();
            let b = machine(p.as_ref(), "since-import").await;
            p.import_workspace(&b, &archive).await.unwrap();
            assert_eq!(p.read_file(&b, "notes/a.txt").await.unwrap(), b"other");
            p.destroy(&b).await.unwrap();
        }
        WorkspaceExport::Unchanged => panic!("a changed workspace was not exported"),
    }
    p.destroy(&m).await.unwrap();
}

/// Stop keeps the machine resumable; destroy makes it gone; destroying twice is fine.
pub async fn lifecycle(p: Arc<dyn SandboxProvider>) {
    let s = spec("lifecycle");
    let m = p.provision(&s).await.unwrap();
    p.write_file(&m, "keep.txt", b"kept").await.unwrap();
    p.stop(&m).await.unwrap();
    p.reconnect(&m, &s).await.unwrap();
    assert_eq!(p.read_file(&m, "keep.txt").await.unwrap(), b"kept");
    p.destroy(&m).await.unwrap();
    assert_eq!(p.reconnect(&m, &s).await, Err(ProviderError::MachineGone));
    assert!(matches!(
        p.exec(&m, &cmd("true")).await,
        Err(ProviderError::MachineGone)
    ));
    p.destroy(&m).await.unwrap();
}

/// Screens: one per bot, stable while open; a second bot gets a distinct slot when the
/// provider reports `multiScreen`, otherwise `MultiScreenUnavailable` while shell and files
/// keep working.
pub async fn screens(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "screens").await;
    let a = p.open_screen(&m, "bot-a").await.unwrap();
    assert_eq!(
        p.open_screen(&m, "bot-a").await.unwrap(),
        a,
        "reopening keeps the slot"
    );
    if p.describe().capabilities.multi_screen {
        let b = p.open_screen(&m, "bot-b").await.unwrap();
        assert_ne!(a.slot, b.slot);
    } else {
        assert_eq!(
            p.open_screen(&m, "bot-b").await,
            Err(ProviderError::MultiScreenUnavailable)
        );
        assert_eq!(
            p.exec(&m, &cmd("echo still")).await.unwrap().stdout,
            "still\n"
        );
        p.write_file(&m, "still.txt", b"ok").await.unwrap();
        p.close_screen(&m, "bot-a").await.unwrap();
        p.open_screen(&m, "bot-b")
            .await
            .expect("the slot is free again");
    }
    p.destroy(&m).await.unwrap();
}

/// Observe returns a PNG; an action batch reports every action completed and a frame.
pub async fn observe_and_act(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "observe").await;
    p.open_screen(&m, "bot-a").await.unwrap();
    let frame = p.observe(&m, "bot-a").await.unwrap();
    assert!(frame.png.starts_with(PNG_SIGNATURE));
    assert!(frame.width > 0 && frame.height > 0);
    let actions = vec![
        Action::Move { x: 10, y: 10 },
        Action::Click {
            x: 20,
            y: 20,
            button: Button::Left,
            double: false,
        },
        Action::Type { text: "hi".into() },
        Action::Key {
            keys: "Return".into(),
        },
    ];
    let outcome = p.act(&m, "bot-a", &actions).await.unwrap();
    assert_eq!(outcome.completed, actions.len());
    assert!(outcome.frame.png.starts_with(PNG_SIGNATURE));
    p.destroy(&m).await.unwrap();
}

/// Instantiate every conformance check as a test. `$make` is an expression producing an
/// `Arc<dyn SandboxProvider>`; it is evaluated once per test. With `gate = <bool expr>`, each
/// test first evaluates the gate and returns early when it is false (a backend that needs an
/// engine decides there whether its absence skips or fails).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!($make, gate = true);
    };
    ($make:expr, gate = $gate:expr) => {
        $crate::conformance_suite!(@tests $make; $gate;
            describes_itself, exec_runs_commands, exec_times_out, files_round_trip,
            files_refuse_escapes, workspace_moves_between_machines,
            unchanged_workspace_is_not_exported_again, lifecycle, screens,
            observe_and_act);
    };
    (@tests $make:expr; $gate:expr; $($check:ident),*) => {
        $(
            #[actix_rt::test]
            async fn $check() {
                if !$gate {
                    return;
                }
                $crate::conformance::$check($make).await;
            }
        )*
    };
}
