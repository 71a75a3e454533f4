//! Ordered action batches applied through XTEST on the display's persistent connection.
//!
//! One batch is one sequence of fake input events on one connection, so the X server sees
//! them in order with no process per action. Characters missing from the keyboard map are
//! bound to a spare keycode for the moment they are typed, like `xdotool type` does.

use std::time::{Duration, Instant};

use rakazo_actors::provider::{Action, Button};
use x11rb::CURRENT_TIME;
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    BUTTON_PRESS_EVENT, BUTTON_RELEASE_EVENT, ConnectionExt as _, KEY_PRESS_EVENT,
    KEY_RELEASE_EVENT, MOTION_NOTIFY_EVENT,
};
use x11rb::protocol::xtest::ConnectionExt as _;

use super::DesktopError;
use super::action_rules::check;
use super::capture::{RawFrame, XDisplay, x_err};
use super::keys::{char_keysym, parse_combo, sym};

pub use super::action_rules::{MAX_SCROLL, MAX_TYPE_CHARS, MAX_WAIT};
/// Pause after a key combination with modifiers (shortcuts move focus asynchronously).
pub(super) const SHORTCUT_PAUSE: Duration = Duration::from_millis(50);
/// Pointer steps of a drag, so applications see the motion between press and release.
const DRAG_STEPS: i32 = 8;
/// Pause between drag steps.
const DRAG_STEP_PAUSE: Duration = Duration::from_millis(8);

/// The server's keyboard map and the keycodes that are free for temporary bindings.
pub struct Keymap {
    /// Lowest keycode.
    min: u8,
    /// Keysyms per keycode.
    per: usize,
    /// Keysyms, `per` for each keycode from `min`.
    syms: Vec<u32>,
    /// Keycodes bound to nothing, used for characters missing from the map.
    spare: Vec<u8>,
    /// Next spare keycode to use (round robin).
    next_spare: usize,
}

impl Keymap {
    fn load(xd: &XDisplay) -> Result<Self, DesktopError> {
        let setup = xd.conn.setup();
        let (min, max) = (setup.min_keycode, setup.max_keycode);
        let reply = xd
            .conn
            .get_keyboard_mapping(min, max - min + 1)
            .map_err(x_err)?
            .reply()
            .map_err(x_err)?;
        let per = usize::from(reply.keysyms_per_keycode).max(1);
        let syms = reply.keysyms;
        let spare = syms
            .chunks(per)
            .enumerate()
            .filter(|(_, ks)| ks.iter().all(|&k| k == 0))
            .map(|(i, _)| min + i as u8)
            .collect();
        Ok(Self {
            min,
            per,
            syms,
            spare,
            next_spare: 0,
        })
    }

    /// The keycode producing `keysym`, and whether Shift is needed.
    fn find(&self, keysym: u32) -> Option<(u8, bool)> {
        for level in 0..2.min(self.per) {
            for (i, ks) in self.syms.chunks(self.per).enumerate() {
                if ks[level] == keysym {
                    return Some((self.min + i as u8, level == 1));
                }
            }
        }
        None
    }
}

impl XDisplay {
    fn keymap(&mut self) -> Result<&mut Keymap, DesktopError> {
        if self.keymap.is_none() {
            self.keymap = Some(Keymap::load(self)?);
        }
        Ok(self.keymap.as_mut().expect("loaded above"))
    }

    /// The keycode for `keysym`, binding a spare keycode when the map lacks it.
    fn keycode(&mut self, keysym: u32) -> Result<(u8, bool), DesktopError> {
        if let Some(found) = self.keymap()?.find(keysym) {
            return Ok(found);
        }
        let map = self.keymap()?;
        if map.spare.is_empty() {
            return Err(DesktopError::X(format!(
                "no spare keycode to bind keysym {keysym:#x}"
            )));
        }
        let code = map.spare[map.next_spare % map.spare.len()];
        map.next_spare += 1;
        let per = map.per;
        let idx = usize::from(code - map.min) * per;
        for (i, slot) in map.syms[idx..idx + per].iter_mut().enumerate() {
            *slot = if i < 2 { keysym } else { 0 };
        }
        let row: Vec<u32> = map.syms[idx..idx + per].to_vec();
        self.conn
            .change_keyboard_mapping(1, code, per as u8, &row)
            .map_err(x_err)?;
        self.sync()?;
        // Clients reload their map on MappingNotify; give them a moment before the key arrives.
        std::thread::sleep(Duration::from_millis(20));
        Ok((code, false))
    }

    /// Waits until the server has processed everything sent so far.
    pub fn sync(&self) -> Result<(), DesktopError> {
        self.conn
            .get_input_focus()
            .map_err(x_err)?
            .reply()
            .map_err(x_err)?;
        Ok(())
    }

    fn fake(&self, kind: u8, detail: u8, x: i16, y: i16) -> Result<(), DesktopError> {
        self.conn
            .xtest_fake_input(kind, detail, CURRENT_TIME, self.root, x, y, 0)
            .map_err(x_err)?;
        Ok(())
    }

    fn point(&self, x: i32, y: i32) -> Result<(i16, i16), String> {
        if x < 0 || y < 0 || x >= i32::from(self.width) || y >= i32::from(self.height) {
            return Err(format!(
                "point ({x}, {y}) is outside the {}x{} screen",
                self.width, self.height
            ));
        }
        Ok((x as i16, y as i16))
    }

    fn move_to(&self, x: i16, y: i16) -> Result<(), DesktopError> {
        self.fake(MOTION_NOTIFY_EVENT, 0, x, y)
    }

    fn button(&self, button: u8, press: bool) -> Result<(), DesktopError> {
        self.fake(
            if press {
                BUTTON_PRESS_EVENT
            } else {
                BUTTON_RELEASE_EVENT
            },
            button,
            0,
            0,
        )
    }

    fn key(&self, code: u8, press: bool) -> Result<(), DesktopError> {
        self.fake(
            if press {
                KEY_PRESS_EVENT
            } else {
                KEY_RELEASE_EVENT
            },
            code,
            0,
            0,
        )
    }

    fn tap_keysym(&mut self, keysym: u32, extra_mods: &[u8]) -> Result<(), DesktopError> {
        let (code, shift) = self.keycode(keysym)?;
        let shift_code = if shift {
            Some(self.keycode(sym::SHIFT_L)?.0)
        } else {
            None
        };
        for &m in extra_mods.iter().chain(shift_code.iter()) {
            self.key(m, true)?;
        }
        self.key(code, true)?;
        self.key(code, false)?;
        for &m in extra_mods.iter().chain(shift_code.iter()).rev() {
            self.key(m, false)?;
        }
        Ok(())
    }

    /// Applies one action; `Err` carries the reason it could not be applied.
    fn apply(&mut self, action: &Action) -> Result<(), DesktopError> {
        let invalid = DesktopError::Invalid;
        match action {
            Action::Move { x, y } => {
                let (x, y) = self.point(*x, *y).map_err(invalid)?;
                self.move_to(x, y)?;
            }
            Action::Click {
                x,
                y,
                button,
                double,
            } => {
                let (x, y) = self.point(*x, *y).map_err(invalid)?;
                let b = match button {
                    Button::Left => 1,
                    Button::Middle => 2,
                    Button::Right => 3,
                };
                self.move_to(x, y)?;
                for _ in 0..if *double { 2 } else { 1 } {
                    self.button(b, true)?;
                    self.button(b, false)?;
                }
            }
            Action::Drag {
                from_x,
                from_y,
                to_x,
                to_y,
            } => {
                let (fx, fy) = self.point(*from_x, *from_y).map_err(invalid)?;
                let (tx, ty) = self.point(*to_x, *to_y).map_err(invalid)?;
                self.move_to(fx, fy)?;
                self.button(1, true)?;
                for step in 1..=DRAG_STEPS {
                    let x = i32::from(fx) + (i32::from(tx) - i32::from(fx)) * step / DRAG_STEPS;
                    let y = i32::from(fy) + (i32::from(ty) - i32::from(fy)) * step / DRAG_STEPS;
                    self.move_to(x as i16, y as i16)?;
                    self.conn.flush().map_err(x_err)?;
                    std::thread::sleep(DRAG_STEP_PAUSE);
                }
                self.button(1, false)?;
            }
            Action::Scroll { x, y, dx, dy } => {
                let (x, y) = self.point(*x, *y).map_err(invalid)?;
                if dx.abs() > MAX_SCROLL || dy.abs() > MAX_SCROLL {
                    return Err(DesktopError::Invalid(format!(
                        "scroll of more than {MAX_SCROLL} notches"
                    )));
                }
                self.move_to(x, y)?;
                let (vertical, horizontal) =
                    (if *dy > 0 { 5 } else { 4 }, if *dx > 0 { 7 } else { 6 });
                for (b, n) in [(vertical, dy.abs()), (horizontal, dx.abs())] {
                    for _ in 0..n {
                        self.button(b, true)?;
                        self.button(b, false)?;
                    }
                }
            }
            Action::Type { text } => {
                if text.chars().count() > MAX_TYPE_CHARS {
                    return Err(DesktopError::Invalid(format!(
                        "text longer than {MAX_TYPE_CHARS} characters"
                    )));
                }
                for (i, c) in text.chars().enumerate() {
                    self.tap_keysym(char_keysym(c), &[])?;
                    if i % 64 == 63 {
                        self.sync()?;
                    }
                }
            }
            Action::Key { keys } => {
                let syms = parse_combo(keys).map_err(invalid)?;
                let (last, mods) = syms
                    .split_last()
                    .expect("parse_combo returns at least one key");
                let mut codes = Vec::with_capacity(mods.len());
                for &m in mods {
                    codes.push(self.keycode(m)?.0);
                }
                self.tap_keysym(*last, &codes)?;
                if !codes.is_empty() {
                    // Shortcuts usually move the focus; give the application a moment.
                    self.sync()?;
                    std::thread::sleep(SHORTCUT_PAUSE);
                }
            }
            Action::Wait { ms } => {
                let wait = Duration::from_millis(*ms);
                if wait > MAX_WAIT {
                    return Err(DesktopError::Invalid(format!(
                        "wait longer than {} ms",
                        MAX_WAIT.as_millis()
                    )));
                }
                self.sync()?;
                std::thread::sleep(wait);
            }
        }
        Ok(())
    }

    /// Applies `actions` in order and waits until the server has processed them. Stops at the
    /// first failure with [`DesktopError::Action`], whose `index` is how many completed.
    pub fn apply_batch(&mut self, actions: &[Action]) -> Result<(), DesktopError> {
        for (index, action) in actions.iter().enumerate() {
            let (width, height) = (u32::from(self.width), u32::from(self.height));
            check(action, width, height).map_err(|reason| DesktopError::Action {
                index,
                reason,
                invalid: true,
            })?;
            self.apply(action)
                .and_then(|()| self.conn.flush().map_err(x_err))
                .map_err(|e| DesktopError::Action {
                    index,
                    invalid: matches!(e, DesktopError::Invalid(_)),
                    reason: match e {
                        DesktopError::Invalid(reason) => reason,
                        other => other.to_string(),
                    },
                })?;
        }
        self.sync().map_err(|e| DesktopError::Action {
            index: actions.len(),
            reason: e.to_string(),
            invalid: false,
        })
    }

    /// Polls the screen until two consecutive frames are identical or `timeout` passes, and
    /// returns the last frame. `first_delay` lets applications react before the first look.
    /// The path for a server without the DAMAGE extension (see [`XDisplay::settle`]).
    pub fn settle_by_polling(
        &mut self,
        first_delay: Duration,
        interval: Duration,
        timeout: Duration,
    ) -> Result<RawFrame, DesktopError> {
        let deadline = Instant::now() + timeout;
        std::thread::sleep(first_delay);
        let mut last = self.grab()?;
        while Instant::now() < deadline {
            std::thread::sleep(interval);
            let next = self.grab()?;
            if next.hash == last.hash {
                return Ok(next);
            }
            last = next;
        }
        Ok(last)
    }
}
