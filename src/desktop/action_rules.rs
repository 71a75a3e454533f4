//! What makes a `computer_act` step invalid on a screen, in one place: every provider (X
//! input, the `xdotool` command path, the fake) refuses the same steps with the same reasons.

use std::time::Duration;

use rakazo_actors::provider::Action;

use super::keys::parse_combo;

/// Longest single `wait` action.
pub const MAX_WAIT: Duration = Duration::from_secs(10);
/// Longest text of one `type` action, in characters.
pub const MAX_TYPE_CHARS: usize = 10_000;
/// Most wheel notches of one `scroll` action.
pub const MAX_SCROLL: i32 = 100;

/// Why `action` cannot be done on a `width` x `height` screen, if it cannot.
pub fn check(action: &Action, width: u32, height: u32) -> Result<(), String> {
    let point = |x: i32, y: i32| -> Result<(), String> {
        if x < 0 || y < 0 || x as u32 >= width || y as u32 >= height {
            return Err(format!(
                "point ({x}, {y}) is outside the {width}x{height} screen"
            ));
        }
        Ok(())
    };
    match action {
        Action::Move { x, y } | Action::Click { x, y, .. } => point(*x, *y),
        Action::Drag {
            from_x,
            from_y,
            to_x,
            to_y,
        } => point(*from_x, *from_y).and_then(|()| point(*to_x, *to_y)),
        Action::Scroll { x, y, dx, dy } => {
            point(*x, *y)?;
            if dx.unsigned_abs() > MAX_SCROLL as u32 || dy.unsigned_abs() > MAX_SCROLL as u32 {
                return Err(format!(
                    "scroll of ({dx}, {dy}) notches: at most {MAX_SCROLL} each way"
                ));
            }
            Ok(())
        }
        Action::Type { text } => {
            let n = text.chars().count();
            if n > MAX_TYPE_CHARS {
                return Err(format!(
                    "text of {n} characters: at most {MAX_TYPE_CHARS} per type action"
                ));
            }
            Ok(())
        }
        Action::Key { keys } => parse_combo(keys).map(|_| ()),
        Action::Wait { ms } => {
            if Duration::from_millis(*ms) > MAX_WAIT {
                return Err(format!(
                    "wait of {ms} ms: at most {} ms",
                    MAX_WAIT.as_millis()
                ));
            }
            Ok(())
        }
    }
}

/// Whether applications may answer `action` some time after it (a click opens a page, a key
/// types into a field), so a batch with one gives them time before its screen counts as
/// settled; a pointer move is answered in the same frame, a wait has waited already.
pub fn answers_later(action: &Action) -> bool {
    !matches!(action, Action::Move { .. } | Action::Wait { .. })
}

/// A short name of the action's kind, for messages.
pub fn kind(action: &Action) -> &'static str {
    match action {
        Action::Move { .. } => "move",
        Action::Click { .. } => "click",
        Action::Drag { .. } => "drag",
        Action::Scroll { .. } => "scroll",
        Action::Type { .. } => "type",
        Action::Key { .. } => "key",
        Action::Wait { .. } => "wait",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_steps_say_why() {
        let bad = |a: Action| check(&a, 1280, 800).unwrap_err();
        assert_eq!(
            bad(Action::Move { x: 5000, y: 10 }),
            "point (5000, 10) is outside the 1280x800 screen"
        );
        assert_eq!(
            bad(Action::Key {
                keys: "ctrl+foo".into()
            }),
            "unknown key \"foo\""
        );
        assert!(
            bad(Action::Scroll {
                x: 1,
                y: 1,
                dx: 0,
                dy: 500
            })
            .contains("at most 100")
        );
        assert!(bad(Action::Wait { ms: 60_000 }).contains("at most 10000 ms"));
        assert!(check(&Action::Move { x: 1279, y: 799 }, 1280, 800).is_ok());
    }
}
