//! Key names and characters to X keysyms: `ctrl+l`, `Return`, `shift+Tab`, typed text.

/// X keysyms used by name.
pub mod sym {
    /// `Return`.
    pub const RETURN: u32 = 0xff0d;
    /// `Tab`.
    pub const TAB: u32 = 0xff09;
    /// `Shift_L`.
    pub const SHIFT_L: u32 = 0xffe1;
    /// `Control_L`.
    pub const CONTROL_L: u32 = 0xffe3;
    /// `Alt_L`.
    pub const ALT_L: u32 = 0xffe9;
    /// `Super_L`.
    pub const SUPER_L: u32 = 0xffeb;
}

/// Named keys, matched case-insensitively.
const NAMED: &[(&str, u32)] = &[
    ("return", sym::RETURN),
    ("enter", sym::RETURN),
    ("tab", sym::TAB),
    ("escape", 0xff1b),
    ("esc", 0xff1b),
    ("backspace", 0xff08),
    ("delete", 0xffff),
    ("del", 0xffff),
    ("insert", 0xff63),
    ("home", 0xff50),
    ("end", 0xff57),
    ("page_up", 0xff55),
    ("pageup", 0xff55),
    ("prior", 0xff55),
    ("page_down", 0xff56),
    ("pagedown", 0xff56),
    ("next", 0xff56),
    ("left", 0xff51),
    ("up", 0xff52),
    ("right", 0xff53),
    ("down", 0xff54),
    ("space", 0x20),
    ("shift", sym::SHIFT_L),
    ("shift_l", sym::SHIFT_L),
    ("ctrl", sym::CONTROL_L),
    ("control", sym::CONTROL_L),
    ("control_l", sym::CONTROL_L),
    ("alt", sym::ALT_L),
    ("alt_l", sym::ALT_L),
    ("super", sym::SUPER_L),
    ("super_l", sym::SUPER_L),
    ("meta", sym::SUPER_L),
    ("cmd", sym::SUPER_L),
    ("win", sym::SUPER_L),
    ("menu", 0xff67),
    ("minus", 0x2d),
    ("plus", 0x2b),
    ("comma", 0x2c),
    ("period", 0x2e),
    ("slash", 0x2f),
];

/// The keysym of a character: Latin-1 maps to itself, control characters to their keys,
/// everything else to the Unicode keysym range.
pub fn char_keysym(c: char) -> u32 {
    match c {
        '\n' | '\r' => sym::RETURN,
        '\t' => sym::TAB,
        ' '..='~' | '\u{a0}'..='\u{ff}' => c as u32,
        _ => 0x0100_0000 + c as u32,
    }
}

/// The keysym of one key name (`Return`, `ctrl`, `F5`, `a`, `0xff0d`), or `None`.
pub fn name_keysym(name: &str) -> Option<u32> {
    let lower = name.to_ascii_lowercase();
    if let Some((_, k)) = NAMED.iter().find(|(n, _)| *n == lower) {
        return Some(*k);
    }
    if let Some(n) = lower.strip_prefix('f').and_then(|n| n.parse::<u32>().ok())
        && (1..=24).contains(&n)
    {
        return Some(0xffbe + n - 1);
    }
    if let Some(hex) = lower.strip_prefix("0x") {
        return u32::from_str_radix(hex, 16).ok();
    }
    let mut chars = name.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Some(char_keysym(c)),
        _ => None,
    }
}

/// Parses a combination such as `ctrl+shift+t` or `Return` into keysyms, modifiers first in
/// the order given. A lone `+` is the plus key.
pub fn parse_combo(combo: &str) -> Result<Vec<u32>, String> {
    let combo = combo.trim();
    if combo.is_empty() {
        return Err("empty key combination".into());
    }
    let parts: Vec<&str> = if combo == "+" {
        vec!["+"]
    } else if let Some(head) = combo.strip_suffix("++") {
        head.split('+').chain(std::iter::once("+")).collect()
    } else {
        combo.split('+').collect()
    };
    parts
        .iter()
        .map(|p| {
            let p = p.trim();
            name_keysym(p)
                .ok_or_else(|| format!("unknown key {:?}", p.chars().take(32).collect::<String>()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combos_parse_to_keysyms() {
        assert_eq!(
            parse_combo("ctrl+l").unwrap(),
            vec![sym::CONTROL_L, 'l' as u32]
        );
        assert_eq!(parse_combo("Return").unwrap(), vec![sym::RETURN]);
        assert_eq!(
            parse_combo("ctrl+shift+Tab").unwrap(),
            vec![sym::CONTROL_L, sym::SHIFT_L, sym::TAB]
        );
        assert_eq!(
            parse_combo("ctrl++").unwrap(),
            vec![sym::CONTROL_L, '+' as u32]
        );
        assert_eq!(parse_combo("F5").unwrap(), vec![0xffc2]);
        assert!(parse_combo("ctrl+nosuchkey").is_err());
        assert!(parse_combo("").is_err());
    }

    #[test]
    fn characters_map_to_keysyms() {
        assert_eq!(char_keysym('A'), 0x41);
        assert_eq!(char_keysym('é'), 0xe9);
        assert_eq!(char_keysym('€'), 0x0100_20ac);
        assert_eq!(char_keysym('\n'), sym::RETURN);
    }
}
