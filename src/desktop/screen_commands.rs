//! Screens through commands only, for machines whose X server this process cannot reach (the
//! remote vendors' path): capture by a small in-computer helper, input by `xdotool`, both run
//! through the provider's [`CommandRunner`] like everything else of the runtime.
//!
//! The helper (`capture_helper.py`, Python's standard library and the machine's libX11) prints
//! the root window as a base64 PNG; frames are compared by the hash of that PNG, which is the
//! same for the same pixels. A batch becomes one script of `xdotool` calls that reports how many
//! actions completed, then the screen settles inside the machine, and the helper prints only
//! the last frame (one command for the whole wait, not one per look): it waits for the X
//! server's reports of drawing (DAMAGE) to stop, as the direct path does, or where the server
//! has none reads the screen until two reads in a row are the same. Where the runner keeps
//! long-lived helpers (the exec agent of a pod, a Docker container or any remote sandbox,
//! [`CommandRunner::ask`]) the helper stays running per display with the display open, asked
//! one line per frame, and no process starts per frame; it answers a screen nothing was drawn on
//! since its last frame with that frame, by its number alone to the screen that has it, and
//! plays a batch (pointer, keys and text) through XTEST and settles after it in one line. Where none
//! is kept, a batch and its settled frame are one command.

use std::path::PathBuf;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rakazo_actors::provider::{ActStop, Action, Button, Frame};

use super::action_rules::{MAX_WAIT, check};
use super::capture::frame_hash;
use super::command::{CommandRunner, SCRIPT_TIMEOUT, install_program};
use super::input::SHORTCUT_PAUSE;
use super::keys::{char_keysym, parse_combo};
use super::runtime::{Observation, Settle};
use super::{DesktopError, shell_quote};
use crate::exec_agent::Helper;

/// The capture helper program.
pub const HELPER_SOURCE: &str = include_str!("capture_helper.py");

/// One display of a machine, reached through commands.
pub struct CommandScreen {
    runner: Arc<dyn CommandRunner>,
    display: u32,
    helper: PathBuf,
    width: u32,
    height: u32,
    /// The last frame the kept helper sent, by its number: a frame it answers as the one this
    /// side has comes from here, not over the runner again.
    last: std::sync::Mutex<Option<(u64, Observation)>>,
}

impl CommandScreen {
    /// Installs the helper under `run_dir` (once per helper version) and waits until display
    /// `:display` answers it, at most `timeout`.
    pub async fn connect(
        runner: Arc<dyn CommandRunner>,
        run_dir: &std::path::Path,
        display: u32,
        timeout: Duration,
    ) -> Result<Self, DesktopError> {
        let helper = install_program(&*runner, run_dir, "capture", HELPER_SOURCE).await?;
        let mut screen = Self {
            runner,
            display,
            helper,
            width: 0,
            height: 0,
            last: std::sync::Mutex::new(None),
        };
        let started = Instant::now();
        loop {
            match screen.grab().await {
                Ok(o) => {
                    screen.width = o.frame.width;
                    screen.height = o.frame.height;
                    return Ok(screen);
                }
                Err(e) if started.elapsed() > timeout => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    fn env(&self) -> String {
        format!("DISPLAY=:{}", self.display)
    }

    /// A screenshot of the display.
    pub async fn grab(&self) -> Result<Observation, DesktopError> {
        self.capture("grab", SCRIPT_TIMEOUT).await
    }

    /// The capture helper kept running for this display by a runner that keeps helpers (asked
    /// `reads`, it answers how many times it read the screen).
    pub fn kept_helper(&self) -> Helper {
        Helper {
            key: format!("capture:{}", self.display),
            argv: vec![
                "python3".into(),
                "-I".into(),
                self.helper.to_string_lossy().into_owned(),
                "serve".into(),
            ],
            env: vec![("DISPLAY".into(), format!(":{}", self.display))],
        }
    }

    /// The capture helper's frame for `request` (`grab`, or `settle` and its times): asked of
    /// the helper kept running for the display where the runner keeps one, else (and when that
    /// fails) from the helper run as a script.
    async fn capture(&self, request: &str, timeout: Duration) -> Result<Observation, DesktopError> {
        for have in [true, false] {
            let line = self.with_have(request, have);
            match self.runner.ask(&self.kept_helper(), &line, timeout).await {
                Some(Ok(answer)) => match self.kept_frame(&answer) {
                    Err(Unknown) => continue,
                    Ok(frame) => return frame,
                },
                Some(Err(e)) => tracing::debug!(error = %e, "desktop.capture.kept_helper_failed"),
                None => {}
            }
            break;
        }
        let args = request.strip_prefix("grab").unwrap_or(request);
        let script = format!(
            "{} exec python3 -I {} {args}",
            self.env(),
            shell_quote(&self.helper.to_string_lossy())
        );
        let out = self.runner.run(&script, timeout).await?;
        if out.exit_code != 0 {
            return Err(DesktopError::X(format!(
                "capture helper: {}",
                out.stderr.trim()
            )));
        }
        let mut lines = out.stdout.lines();
        let size = lines.next().unwrap_or_default();
        observation(size, lines.next().unwrap_or_default())
    }

    /// `request` to the kept helper, beginning `have SEQ ` with the number of the last frame
    /// it sent here (when `have` and there is one), so that the same frame is not sent again.
    fn with_have(&self, request: &str, have: bool) -> String {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match last.as_ref() {
            Some((seq, _)) if have => format!("have {seq} {request}"),
            _ => request.to_owned(),
        }
    }

    /// The frame of a kept helper's answer, "SEQ WIDTH HEIGHT BASE64" or "SEQ WIDTH HEIGHT ="
    /// (the frame this side has, by its number), or "! REASON"; `Err(Unknown)` when the helper
    /// named a frame this side no longer has (asked by another, meanwhile).
    fn kept_frame(&self, answer: &str) -> Result<Result<Observation, DesktopError>, Unknown> {
        if let Some(reason) = answer.strip_prefix("! ") {
            return Ok(Err(DesktopError::X(format!("capture helper: {reason}"))));
        }
        let mut words = answer.splitn(4, ' ');
        let seq = words.next().and_then(|w| w.parse::<u64>().ok());
        let size = [words.next(), words.next()].map(Option::unwrap_or_default);
        let (Some(seq), Some(png)) = (seq, words.next()) else {
            return Ok(Err(DesktopError::X(
                "capture helper printed no frame".into(),
            )));
        };
        if png == "=" {
            let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            return match last.as_ref() {
                Some((kept, frame)) if *kept == seq => Ok(Ok(frame.clone())),
                _ => Err(Unknown),
            };
        }
        let frame = observation(&size.join(" "), png);
        if let Ok(frame) = &frame {
            *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some((seq, frame.clone()));
        }
        Ok(frame)
    }

    /// How many visible browser windows the display shows.
    pub async fn browser_windows(&self) -> Result<usize, DesktopError> {
        let script = format!(
            "{} xdotool search --onlyvisible --class chromium 2>/dev/null | wc -l",
            self.env()
        );
        let out = self.runner.run(&script, SCRIPT_TIMEOUT).await?;
        Ok(out.stdout.trim().parse().unwrap_or(0))
    }

    /// Applies `actions` in order, then waits for the screen to settle (see [`Self::settle`]):
    /// how many completed, why the next one failed, and the settled frame. Where the runner
    /// keeps helpers, a batch and its settled frame are one line to the kept helper (played
    /// through XTEST, or by the helper running the batch's `xdotool` script where the machine
    /// has no XTEST); elsewhere the batch and its settled frame are one command.
    pub async fn act(
        &self,
        actions: &[Action],
        settle: Settle,
        react: Duration,
        quiet: Duration,
    ) -> Result<(usize, Option<ActStop>, Observation), DesktopError> {
        if let Some(acted) = self.act_by_xtest(actions, settle, react, quiet).await {
            return acted;
        }
        let batch = self.batch_script(actions);
        if self.runner.keeps_helpers() {
            if let Some(acted) = self
                .act_by_script(&batch, actions.len(), settle, react, quiet)
                .await
            {
                return acted;
            }
            let (completed, error) = match self.runner.run(&batch, SCRIPT_TIMEOUT + MAX_WAIT).await
            {
                Ok(out) => batch_outcome(&out.stdout, &out.stderr, actions.len()),
                Err(e) => (0, Some(ActStop::failed(e.to_string()))),
            };
            return Ok((completed, error, self.settle(settle, react, quiet).await?));
        }
        // One command: the batch in a subshell (a failed action ends only it), a mark, then the
        // helper's settled frame.
        let script = format!(
            "({batch})\necho {FRAME_MARK}\n{} exec python3 -I {} {}",
            self.env(),
            shell_quote(&self.helper.to_string_lossy()),
            settle_args(settle, react, quiet)
        );
        let longest = SCRIPT_TIMEOUT + MAX_WAIT + settle.first_delay.max(react) + settle.timeout;
        let out = self.runner.run(&script, longest + SCRIPT_TIMEOUT).await?;
        let Some((batch_out, frame)) = out.stdout.split_once(&format!("{FRAME_MARK}\n")) else {
            return Err(DesktopError::X(format!(
                "the batch ended without its frame: {}",
                out.stderr.trim()
            )));
        };
        let (completed, error) = batch_outcome(batch_out, &out.stderr, actions.len());
        if out.exit_code != 0 {
            return Err(DesktopError::X(format!(
                "capture helper: {}",
                out.stderr.trim()
            )));
        }
        let mut lines = frame.lines();
        let size = lines.next().unwrap_or_default();
        Ok((
            completed,
            error,
            observation(size, lines.next().unwrap_or_default())?,
        ))
    }

    /// The script of `xdotool` calls that applies `actions`, printing the count done after
    /// each and `!REASON` for an action that cannot be.
    fn batch_script(&self, actions: &[Action]) -> String {
        let mut script = format!("export {}\n", self.env());
        for (index, action) in actions.iter().enumerate() {
            match xdotool(action, self.width, self.height) {
                Ok(cmd) => {
                    script.push_str(&format!("{cmd} || exit 1\necho {}\n", index + 1));
                }
                Err(reason) => {
                    script.push_str(&format!("echo {}\n", shell_quote(&format!("!{reason}"))));
                    break;
                }
            }
        }
        script
    }

    /// [`Self::act`] through XTEST in the helper kept for the display: the input and the
    /// settled frame in one line, no process start per action. `None` when it cannot be (a
    /// runner that keeps no helpers, no XTEST there): nothing was played, and the caller runs
    /// `xdotool`.
    async fn act_by_xtest(
        &self,
        actions: &[Action],
        settle: Settle,
        react: Duration,
        quiet: Duration,
    ) -> Option<Result<(usize, Option<ActStop>, Observation), DesktopError>> {
        let mut groups = Vec::new();
        let mut invalid = None;
        for action in actions {
            let steps = xtest_steps(action);
            if invalid.is_none() {
                match check(action, self.width, self.height) {
                    Ok(()) => groups.push(steps),
                    Err(reason) => invalid = Some(reason),
                }
            }
        }
        if groups.is_empty() {
            let frame = self.settle(settle, react, quiet).await;
            return Some(frame.map(|f| (0, invalid.map(ActStop::invalid), f)));
        }
        let answer = self
            .ask_then_settle("act", &groups.join("|"), settle, react, quiet)
            .await?;
        let (done, frame) = match answer {
            Ok(line) if line.starts_with('!') => return None,
            Ok(line) => {
                let (done, frame) = line.split_once(' ').unwrap_or((&line, ""));
                let frame = match self.kept_frame(frame) {
                    Ok(frame) => frame,
                    // Played and settled: only the frame is asked for again.
                    Err(Unknown) => self.grab().await,
                };
                (done.trim().parse().unwrap_or(0), frame)
            }
            // What was played before the helper went is not known: none counts as done, and
            // the frame comes as it would without the helper.
            Err(e) => {
                let reason = format!("input: {e}");
                return Some(self.failed_batch(reason, settle, react, quiet).await);
            }
        };
        let stop = if done < groups.len() {
            Some(ActStop::failed("input: the helper stopped"))
        } else {
            invalid.map(ActStop::invalid)
        };
        Some(frame.map(|f| (done, stop, f)))
    }

    /// Asks the kept helper `HEAD TIMES ; TAIL`: a batch (`act` or `script`), then the settle
    /// of these waits, the frame the screen has named by its number. `None` where the runner
    /// keeps no helper.
    async fn ask_then_settle(
        &self,
        head: &str,
        tail: &str,
        settle: Settle,
        react: Duration,
        quiet: Duration,
    ) -> Option<Result<String, DesktopError>> {
        let times = settle_args(settle, react, quiet);
        let request = format!("{head} {} ; {tail}", times.trim_start_matches("settle "));
        let line = self.with_have(&request, true);
        let longest = settle.first_delay.max(react) + settle.timeout;
        let timeout = SCRIPT_TIMEOUT + MAX_WAIT + longest + SCRIPT_TIMEOUT;
        self.runner.ask(&self.kept_helper(), &line, timeout).await
    }

    /// The outcome of a batch that failed for `reason` before anything of it is known to have
    /// run (none counts as done, it is never played twice), with the frame as it settles.
    async fn failed_batch(
        &self,
        reason: String,
        settle: Settle,
        react: Duration,
        quiet: Duration,
    ) -> Result<(usize, Option<ActStop>, Observation), DesktopError> {
        let frame = self.settle(settle, react, quiet).await?;
        Ok((0, Some(ActStop::failed(reason)), frame))
    }

    /// [`Self::act`] of the `xdotool` script `batch` (of `len` actions) run by the helper kept
    /// for the display, which then settles: one line. `None` where the runner keeps no helper
    /// (nothing ran).
    async fn act_by_script(
        &self,
        batch: &str,
        len: usize,
        settle: Settle,
        react: Duration,
        quiet: Duration,
    ) -> Option<Result<(usize, Option<ActStop>, Observation), DesktopError>> {
        let head = format!("script {}", (SCRIPT_TIMEOUT + MAX_WAIT).as_millis());
        let encoded = base64::engine::general_purpose::STANDARD.encode(batch);
        let answer = self
            .ask_then_settle(&head, &encoded, settle, react, quiet)
            .await?;
        let line = match answer {
            Ok(line) => line,
            // Whether the batch ran before the helper went is not known: none counts as done.
            Err(e) => {
                let reason = format!("the batch: {e}");
                return Some(self.failed_batch(reason, settle, react, quiet).await);
            }
        };
        if let Some(reason) = line.strip_prefix("! ") {
            let reason = format!("the batch: {reason}");
            return Some(self.failed_batch(reason, settle, react, quiet).await);
        }
        let mut words = line.splitn(4, ' ');
        let stream = |word: Option<&str>| {
            let word = word.unwrap_or(".");
            let bytes = match word {
                "." => Vec::new(),
                b64 => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap_or_default(),
            };
            String::from_utf8_lossy(&bytes).into_owned()
        };
        // The exit code says no more than the counts the batch printed.
        let _exit = words.next();
        let (out, err) = (stream(words.next()), stream(words.next()));
        let (completed, stop) = batch_outcome(&out, &err, len);
        let frame = match self.kept_frame(words.next().unwrap_or_default()) {
            Ok(frame) => frame,
            Err(Unknown) => self.grab().await,
        };
        Some(frame.map(|f| (completed, stop, f)))
    }

    /// Waits for the screen to settle, inside the machine, and returns the last frame: settled
    /// once nothing was drawn for `quiet`, but no sooner than `react`, where the X server
    /// reports drawing (DAMAGE); otherwise once two frames `settle.interval` apart, the first
    /// `settle.first_delay` from now, are the same. At most `settle.timeout` either way.
    pub async fn settle(
        &self,
        settle: Settle,
        react: Duration,
        quiet: Duration,
    ) -> Result<Observation, DesktopError> {
        // One command (or one line to the kept helper), whatever the number of looks.
        let args = settle_args(settle, react, quiet);
        let longest = settle.first_delay.max(react) + settle.timeout;
        self.capture(&args, longest + SCRIPT_TIMEOUT).await
    }
}

/// A kept helper named a frame this side does not have.
struct Unknown;

/// Printed between a batch's counts and its frame when the two are one command.
const FRAME_MARK: &str = "--rakazo-frame--";

/// The helper's `settle` request for these waits (see [`CommandScreen::settle`]).
fn settle_args(settle: Settle, react: Duration, quiet: Duration) -> String {
    format!(
        "settle {} {} {} {} {}",
        settle.first_delay.as_millis(),
        settle.interval.as_millis(),
        settle.timeout.as_millis(),
        react.as_millis(),
        quiet.as_millis()
    )
}

/// How many of `len` actions a batch script completed (its `stdout`), and why the next one
/// failed.
fn batch_outcome(stdout: &str, stderr: &str, len: usize) -> (usize, Option<ActStop>) {
    let mut completed = 0;
    let mut error = None;
    for line in stdout.lines() {
        match line.strip_prefix('!') {
            Some(reason) => error = Some(ActStop::invalid(reason)),
            None => completed = line.trim().parse().unwrap_or(completed),
        }
    }
    if error.is_none() && completed < len {
        error = Some(ActStop::failed(format!("xdotool: {}", stderr.trim())));
    }
    (completed, error)
}

/// The frame the capture helper printed: `size` ("WIDTH HEIGHT") and the base64 PNG.
fn observation(size: &str, png: &str) -> Result<Observation, DesktopError> {
    let (width, height) = size
        .split_once(' ')
        .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
        .ok_or_else(|| DesktopError::X("capture helper printed no size".into()))?;
    let png = base64::engine::general_purpose::STANDARD
        .decode(png)
        .map_err(|_| DesktopError::X("capture helper printed no image".into()))?;
    Ok(Observation {
        hash: frame_hash(&png),
        frame: Frame {
            png,
            width,
            height,
            notice: None,
            screen: None,
        },
    })
}

/// The `xdotool` call of one action on a `width` x `height` screen, or why it is invalid.
fn xdotool(action: &Action, width: u32, height: u32) -> Result<String, String> {
    check(action, width, height)?;
    let point =
        |x: i32, y: i32| -> Result<String, String> { Ok(format!("mousemove --sync {x} {y}")) };
    Ok(match action {
        Action::Move { x, y } => format!("xdotool {}", point(*x, *y)?),
        Action::Click {
            x,
            y,
            button,
            double,
        } => format!(
            "xdotool {} click --repeat {} {}",
            point(*x, *y)?,
            if *double { 2 } else { 1 },
            button_number(*button)
        ),
        Action::Drag {
            from_x,
            from_y,
            to_x,
            to_y,
        } => format!(
            "xdotool {} mousedown 1 {} mouseup 1",
            point(*from_x, *from_y)?,
            point(*to_x, *to_y)?
        ),
        Action::Scroll { x, y, dx, dy } => {
            let mut cmd = format!("xdotool {}", point(*x, *y)?);
            for (amount, negative, positive) in [(*dy, 4, 5), (*dx, 6, 7)] {
                if amount != 0 {
                    let button = if amount < 0 { negative } else { positive };
                    cmd.push_str(&format!(
                        " click --repeat {} {button}",
                        amount.unsigned_abs()
                    ));
                }
            }
            cmd
        }
        Action::Type { text } => {
            format!("xdotool type --delay 0 -- {}", shell_quote(text))
        }
        Action::Key { keys } => {
            let syms = parse_combo(keys)?;
            let combo: Vec<String> = syms.iter().map(|s| format!("0x{s:x}")).collect();
            format!("xdotool key --clearmodifiers {}", combo.join("+"))
        }
        Action::Wait { ms } => {
            format!("sleep {}", Duration::from_millis(*ms).as_secs_f64())
        }
    })
}

/// The XTEST steps of one action (see `capture_helper.py`), played as the direct path plays
/// it: keys and text by keysym, a combination's modifiers held around its last key and a
/// short pause after a shortcut. A combination that does not parse has none (`check` refuses
/// it before).
fn xtest_steps(action: &Action) -> String {
    let press = |button: u8, times: u32| format!(" d {button} u {button}").repeat(times as usize);
    match action {
        Action::Move { x, y } => format!("m {x} {y}"),
        Action::Click {
            x,
            y,
            button,
            double,
        } => format!(
            "m {x} {y}{}",
            press(button_number(*button), if *double { 2 } else { 1 })
        ),
        Action::Drag {
            from_x,
            from_y,
            to_x,
            to_y,
        } => format!("m {from_x} {from_y} d 1 m {to_x} {to_y} u 1"),
        Action::Scroll { x, y, dx, dy } => {
            let mut steps = format!("m {x} {y}");
            for (amount, negative, positive) in [(*dy, 4, 5), (*dx, 6, 7)] {
                let button = if amount < 0 { negative } else { positive };
                steps.push_str(&press(button, amount.unsigned_abs()));
            }
            steps
        }
        Action::Wait { ms } => format!("w {ms}"),
        Action::Type { text } => text
            .chars()
            .map(|c| format!("t {}", char_keysym(c)))
            .collect::<Vec<_>>()
            .join(" "),
        Action::Key { keys } => {
            let Some((last, mods)) = parse_combo(keys).ok().and_then(|syms| {
                let (last, mods) = syms.split_last()?;
                Some((*last, mods.to_vec()))
            }) else {
                return String::new();
            };
            let mut steps: Vec<String> = mods.iter().map(|m| format!("p {m}")).collect();
            steps.push(format!("t {last}"));
            steps.extend(mods.iter().rev().map(|m| format!("r {m}")));
            if !mods.is_empty() {
                steps.push(format!("w {}", SHORTCUT_PAUSE.as_millis()));
            }
            steps.join(" ")
        }
    }
}

fn button_number(button: Button) -> u8 {
    match button {
        Button::Left => 1,
        Button::Middle => 2,
        Button::Right => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_become_xtest_steps() {
        let steps = |a: Action| xtest_steps(&a);
        assert_eq!(
            steps(Action::Click {
                x: 10,
                y: 20,
                button: Button::Right,
                double: true
            }),
            "m 10 20 d 3 u 3 d 3 u 3"
        );
        assert_eq!(
            steps(Action::Scroll {
                x: 1,
                y: 2,
                dx: -1,
                dy: 2
            }),
            "m 1 2 d 5 u 5 d 5 u 5 d 6 u 6"
        );
        assert_eq!(
            steps(Action::Drag {
                from_x: 1,
                from_y: 2,
                to_x: 3,
                to_y: 4
            }),
            "m 1 2 d 1 m 3 4 u 1"
        );
        assert_eq!(steps(Action::Wait { ms: 5 }), "w 5");
        // Keys by keysym: a shortcut's modifiers held around its last key, then a pause.
        assert_eq!(steps(Action::Key { keys: "a".into() }), "t 97");
        assert_eq!(
            steps(Action::Key {
                keys: "ctrl+shift+Tab".into()
            }),
            "p 65507 p 65505 t 65289 r 65505 r 65507 w 50"
        );
        assert_eq!(
            steps(Action::Type {
                text: "A\n€".into()
            }),
            "t 65 t 65293 t 16785580"
        );
        assert_eq!(
            steps(Action::Key {
                keys: "nosuchkey".into()
            }),
            ""
        );
    }

    #[test]
    fn actions_become_xdotool_calls() {
        let call = |a: Action| xdotool(&a, 1280, 800);
        assert_eq!(
            call(Action::Click {
                x: 10,
                y: 20,
                button: Button::Right,
                double: true
            }),
            Ok("xdotool mousemove --sync 10 20 click --repeat 2 3".into())
        );
        assert_eq!(
            call(Action::Key {
                keys: "ctrl+l".into()
            }),
            Ok("xdotool key --clearmodifiers 0xffe3+0x6c".into())
        );
        assert_eq!(
            call(Action::Type {
                text: "it's $HOME".into()
            }),
            Ok(format!(
                "xdotool type --delay 0 -- {}",
                shell_quote("it's $HOME")
            ))
        );
        assert_eq!(
            call(Action::Scroll {
                x: 5,
                y: 5,
                dx: 0,
                dy: -3
            }),
            Ok("xdotool mousemove --sync 5 5 click --repeat 3 4".into())
        );
        assert!(call(Action::Move { x: 1280, y: 0 }).is_err());
        assert!(call(Action::Wait { ms: 60_000 }).is_err());
        assert!(
            call(Action::Key {
                keys: "ctrl+nosuchkey".into()
            })
            .is_err()
        );
    }
}
