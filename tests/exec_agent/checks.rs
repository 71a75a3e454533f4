//! What every machine with an exec agent must show, whichever exec holds it (the Docker
//! engine's, Kubernetes' `pods/exec`, an E2B sandbox's attached process): scripts run through one agent with the same outcomes as
//! without it, and the bot (uid 1000 like the agent) can stop it or kill it but never read its
//! pipes or answer for it; a killed or stopped agent is replaced and its script killed. On the
//! plain command path the agent keeps the capture helper: frames and pointer input need no
//! process start.

use std::time::{Duration, Instant};

use rakazo_actors::conformance::cmd;
use rakazo_actors::provider::{ProviderError, ProviderRef, SandboxProvider};

/// The agent's command line, as `pgrep -f` finds it (`[a]`: not the script that looks for it).
/// Where the machine runs another agent beside the one under test (an emulator's own), the
/// test names its agent more closely.
pub const AGENT: &str = "rakazo-exec-[a]gent";

/// A script's exit code, standard output and standard error.
pub async fn run(p: &dyn SandboxProvider, m: &ProviderRef, script: &str) -> (i32, String, String) {
    let out = p.exec(m, &cmd(script)).await.expect(script);
    (out.exit_code, out.stdout, out.stderr)
}

/// Whether `script` exits 0 within 10 s of tries (a kill sent on its own runs after the answer).
async fn eventually(p: &dyn SandboxProvider, m: &ProviderRef, script: &str) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if run(p, m, script).await.0 == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The pid of the machine's one agent whose command line matches `agent`.
pub async fn agent_pid(p: &dyn SandboxProvider, m: &ProviderRef, agent: &str) -> String {
    let (code, pid, _) = run(p, m, &format!("pgrep -f '{agent}'")).await;
    assert_eq!(code, 0, "an exec agent runs");
    pid.trim().to_string()
}

/// Scripts run through one agent, with the outcomes of the exec wrapper: exit codes, streams,
/// environment and working directory, caps, signals, the deadline, background writers.
pub async fn scripts_run_through_one_agent(p: &dyn SandboxProvider, m: &ProviderRef, agent: &str) {
    let pid = agent_pid(p, m, agent).await;
    assert!(!pid.is_empty() && !pid.contains('\n'), "one agent: {pid:?}");
    assert_eq!(
        run(p, m, "echo out; echo err >&2; exit 3").await,
        (3, "out\n".into(), "err\n".into())
    );
    assert_eq!(
        agent_pid(p, m, agent).await,
        pid,
        "the same agent runs every script"
    );
    let mut env = cmd("echo \"$A $B\"; pwd");
    env.env = vec![("A".into(), "1".into()), ("B".into(), "two words".into())];
    env.cwd = "sub".into();
    let (_, home, _) = run(p, m, "mkdir -p sub && pwd").await;
    let out = p.exec(m, &env).await.unwrap();
    assert_eq!(out.stdout, format!("1 two words\n{}/sub\n", home.trim()));

    // Each stream is capped at 1 MiB; a script killed by a signal answers 128 + its number.
    let (code, out, err) = run(p, m, "yes | head -c 3000000; echo done >&2").await;
    assert_eq!((code, out.len(), err.as_str()), (0, 1 << 20, "done\n"));
    assert_eq!(run(p, m, "kill -9 $$").await.0, 137);

    // The deadline kills the script's whole process group, output flooding or not.
    let mut flood = cmd("sleep 61 & while true; do echo spam; done");
    flood.timeout = Duration::from_millis(500);
    let started = Instant::now();
    let out = p.exec(m, &flood).await.unwrap();
    assert!(out.timed_out && out.exit_code == -1, "{:?}", out.exit_code);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        eventually(p, m, "! pgrep -f 'sleep [6]1'").await,
        "the group went"
    );

    // A background process does not hold the answer back, and keeps writing to the script's
    // output after the answer without being stopped by it. Its count is renamed into place, so
    // a read never lands between the file's truncation and its write.
    let started = Instant::now();
    let (_, out, _) = run(
        p,
        m,
        "(n=0; while true; do echo tick; n=$((n+1)); echo $n > /tmp/ticker.n; mv /tmp/ticker.n /tmp/ticker; sleep 0.05; done) & echo started",
    )
    .await;
    // The writer's first tick may come before or after `started`: both write to one output.
    assert!(out.lines().any(|l| l == "started"), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let (_, first, _) = run(p, m, "sleep 0.5; cat /tmp/ticker").await;
    let (_, second, _) = run(p, m, "sleep 0.5; cat /tmp/ticker").await;
    assert!(!second.is_empty(), "the background writer counts");
    assert_ne!(first, second, "the background writer still runs");
    run(p, m, "pkill -f 'echo [t]ick'; true").await;
}

/// The attacker's tries on the agent's pipes fail; a killed agent and a stopped one are
/// replaced, and the script each had under way is killed.
pub async fn a_lost_agent_is_replaced_and_its_pipes_stay_closed(
    p: &dyn SandboxProvider,
    m: &ProviderRef,
    agent: &str,
) {
    let pid = agent_pid(p, m, agent).await;

    // The attacker's try: read the agent's requests, write an answer of its own, read its
    // environment. The agent is undumpable: /proc refuses all three.
    let (_, out, _) = run(
        p,
        m,
        &format!(
            "for f in fd/0 fd/1; do cat /proc/{pid}/$f >/dev/null 2>&1 & sleep 0.2; kill $! 2>/dev/null && echo READ-$f; \
             echo '{{\"id\":99}}' 2>/dev/null > /proc/{pid}/$f && echo WROTE-$f; done; \
             cat /proc/{pid}/environ >/dev/null 2>&1 && echo ENVIRON; ls /proc/{pid}/fd >/dev/null 2>&1 && echo FDS; echo checked"
        ),
    )
    .await;
    assert_eq!(out, "checked\n", "the agent's pipes are closed to the bot");

    // Killed with a script under way: that script fails and is killed, the next gets a new
    // agent.
    let mut doomed = cmd(&format!(
        "touch /tmp/doomed-started; pkill -KILL -f '{agent}'; sleep 30"
    ));
    doomed.timeout = Duration::from_secs(60);
    let started = Instant::now();
    let lost = p.exec(m, &doomed).await;
    assert!(
        matches!(&lost, Err(e) if *e != ProviderError::MachineGone),
        "a script whose agent was killed fails: {lost:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    let next = agent_pid(p, m, agent).await;
    assert_ne!(next, pid, "a new agent");
    assert!(
        eventually(
            p,
            m,
            "test -e /tmp/doomed-started && ! pgrep -f 'sleep [3]0'"
        )
        .await,
        "the lost script ran, and was killed"
    );

    // Stopped with a script under way: past the deadline that script times out, is killed,
    // and the agent is given up.
    let mut frozen = cmd(&format!("pkill -STOP -f '{agent}'; sleep 40"));
    frozen.timeout = Duration::from_millis(300);
    let out = p.exec(m, &frozen).await.unwrap();
    assert!(out.timed_out);
    let newest = agent_pid(p, m, agent).await;
    assert!(
        newest.lines().any(|l| l != next),
        "a new agent beside the stopped one"
    );
    assert!(
        eventually(p, m, "! pgrep -f 'sleep [4]0'").await,
        "the stopped agent's script was killed"
    );
}

/// A copy of the computer image without `python3` (an operator's own image), removed on drop.
pub struct ImageWithoutPython(pub String);

impl ImageWithoutPython {
    /// Made with `docker commit` from the built-in image.
    pub fn make() -> Self {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let image = format!("rakazo-computer-test:nopython-{suffix}");
        let builder = format!("rakazo-nopython-{suffix}");
        docker(&[
            "run",
            "--user",
            "0",
            "--name",
            &builder,
            &rakazo::image::default_image(),
            "sh",
            "-c",
            "rm -f /usr/bin/python3*",
        ]);
        docker(&["commit", &builder, &image]);
        docker(&["rm", "-f", &builder]);
        Self(image)
    }
}

impl Drop for ImageWithoutPython {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &self.0])
            .output();
    }
}

fn docker(args: &[&str]) {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// On a machine without `python3` scripts run through the exec wrapper with the same outcomes.
pub async fn scripts_run_without_python(p: &dyn SandboxProvider, m: &ProviderRef) {
    assert_eq!(
        run(p, m, "command -v python3 || echo none").await.1,
        "none\n"
    );
    assert_eq!(
        run(p, m, "echo hi; exit 4").await,
        (4, "hi\n".into(), String::new())
    );
    let mut slow = cmd("sleep 30");
    slow.timeout = Duration::from_millis(300);
    assert!(p.exec(m, &slow).await.unwrap().timed_out);
}

/// Whether the bot's screen answers with a PNG.
async fn observes(p: &dyn SandboxProvider, m: &ProviderRef, bot: &str) -> bool {
    p.observe(m, bot).await.unwrap().png.starts_with(b"\x89PNG")
}

/// The frames of `bot`'s open screen on a plain command path come from one capture helper the
/// agent keeps for its display; the bot cannot write into its answers, and a helper it kills
/// is replaced (the frame in between comes through a script).
pub async fn frames_come_from_one_kept_helper(p: &dyn SandboxProvider, m: &ProviderRef, bot: &str) {
    // The helper's process, found by its command line (not the script that looks for it).
    const HELPER: &str = "pgrep -f 'capture.* [s]erve'";
    let first = p.observe(m, bot).await.unwrap();
    assert!(first.png.starts_with(b"\x89PNG"));
    let (code, pid, _) = run(p, m, HELPER).await;
    assert_eq!(code, 0, "a capture helper runs");
    let pid = pid.trim().to_owned();
    assert!(
        !pid.is_empty() && !pid.contains('\n'),
        "one helper: {pid:?}"
    );
    let again = p.observe(m, bot).await.unwrap();
    assert_eq!((again.width, again.height), (first.width, first.height));
    assert_eq!(
        run(p, m, HELPER).await.1.trim(),
        pid,
        "the same helper reads every frame"
    );

    // The attacker's try: write a frame of its own into the helper's answers, or open its
    // pipes. The helper is undumpable: /proc refuses.
    let (_, out, _) = run(
        p,
        m,
        &format!(
            "echo '1 1 AAAA' 2>/dev/null > /proc/{pid}/fd/1 && echo WROTE; \
             ls /proc/{pid}/fd >/dev/null 2>&1 && echo FDS; echo checked"
        ),
    )
    .await;
    assert_eq!(out, "checked\n", "the helper's pipes are closed to the bot");
    assert!(observes(p, m, bot).await);

    // Killed by the bot: the next frame still comes (through a script), then a new helper.
    run(p, m, "pkill -KILL -f 'capture.* [s]erve'; true").await;
    for _ in 0..2 {
        assert!(observes(p, m, bot).await);
    }
    let (code, next, _) = run(p, m, HELPER).await;
    assert_eq!(code, 0, "a new helper runs");
    assert_ne!(next.trim(), pid, "a new helper");
}

/// A batch of pointer moves on `bot`'s open screen on a plain command path is played through
/// XTEST in the kept helper (no process started for it), stops at an action off the screen,
/// and keys and text go through XTEST too.
pub async fn pointer_input_goes_through_xtest(p: &dyn SandboxProvider, m: &ProviderRef, bot: &str) {
    use rakazo_actors::provider::Action;
    let on_display = "export DISPLAY=:$(ls /tmp/.X11-unix | head -1 | tr -d X);";
    let pointer = || async {
        let script = format!("{on_display} xdotool getmouselocation | cut -d' ' -f1,2");
        run(p, m, &script).await.1
    };
    // The most recent process id in the machine: how many processes a step started.
    let last_pid = || async {
        let out = run(p, m, "cut -d' ' -f5 /proc/loadavg").await;
        out.1.trim().parse::<i64>().unwrap()
    };
    let moves = |points: &[(i32, i32)]| -> Vec<Action> {
        points.iter().map(|&(x, y)| Action::Move { x, y }).collect()
    };

    let done = p
        .act(m, bot, &moves(&[(100, 200), (321, 123)]))
        .await
        .unwrap();
    assert_eq!((done.completed, done.stopped), (2, None));
    assert_eq!(pointer().await, "x:321 y:123\n");

    // Ten moves and their settled frame start no process in the machine (xdotool would start
    // ten, a capture helper run as a script more).
    let (a, b) = (last_pid().await, last_pid().await);
    let ten: Vec<(i32, i32)> = (0..10).map(|i| (200 + 30 * i, 300)).collect();
    p.act(m, bot, &moves(&ten)).await.unwrap();
    let c = last_pid().await;
    assert!(
        (c - b) - (b - a) < 5,
        "processes started: {}",
        (c - b) - (b - a)
    );
    assert_eq!(pointer().await, "x:470 y:300\n");

    // An action off the screen stops the batch there, the ones before it done.
    let stopped = p
        .act(m, bot, &moves(&[(10, 10), (99_999, 1), (20, 20)]))
        .await
        .unwrap();
    assert_eq!(stopped.completed, 1);
    assert!(
        stopped
            .stopped
            .is_some_and(|s| s.reason.contains("outside"))
    );
    assert_eq!(pointer().await, "x:10 y:10\n");

    // A batch with a key goes through xdotool, whole.
    // Keys and text go through XTEST too: a batch with a key, a shortcut and typed text starts
    // no process, and a character missing from the keyboard map is bound to a spare keycode
    // (as the direct path does; `xdotool` would start processes and restore the map).
    let snowmen = format!("{on_display} xkbcomp -xkb \"$DISPLAY\" - 2>/dev/null | grep -c U2603");
    assert_eq!(
        run(p, m, &snowmen).await.1,
        "0\n",
        "no snowman in the map yet"
    );
    let keyed = vec![
        Action::Move { x: 50, y: 60 },
        Action::Key {
            keys: "Escape".into(),
        },
        Action::Key {
            keys: "ctrl+shift+Escape".into(),
        },
        Action::Type {
            text: "a☃".into()
        },
    ];
    let (a, b) = (last_pid().await, last_pid().await);
    let done = p.act(m, bot, &keyed).await.unwrap();
    let c = last_pid().await;
    assert_eq!((done.completed, done.stopped), (4, None));
    assert!(
        (c - b) - (b - a) < 5,
        "processes started: {}",
        (c - b) - (b - a)
    );
    assert_eq!(pointer().await, "x:50 y:60\n");
    assert_ne!(run(p, m, &snowmen).await.1, "0\n", "the snowman was bound");
}
