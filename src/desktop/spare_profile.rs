//! Spare browser profiles: the profile a spare desktop's browser starts on before any bot is
//! known, and the hand-over that makes it the profile of the new bot that takes the desktop.
//!
//! A spare desktop's browser runs on `.browser-profiles/.spare-<id>` (bot ids cannot start
//! with a dot, so no bot's profile has such a name). When the bot that takes the desktop has
//! no profile yet, that directory becomes its profile: renamed to the bot's name, with a link
//! left at the spare name pointing to it, so the running browser, which keeps the path it was
//! started with, finds its files where they now are. The link goes when the desktop is torn
//! down; the bot's next browser starts on the bot's own path. A bot with a profile of its own
//! gets only the spare's display stack: the spare's browser is stopped and its profile removed.
//!
//! A spare's browser may still be opening parts of its profile when a bot takes it (Chromium
//! opens some databases late), by the spare path. Between the rename and the link that path
//! is missing, and such a write would make a new directory there: the running browser would
//! then keep part of its state in it, apart from the bot's profile, and lose it with the
//! spare's name at teardown. So the script holds the browser's process group still
//! (`SIGSTOP`) from just before the rename until the link is made, and never makes the link
//! inside a directory that appeared at that name. On this host no hold is needed: the
//! directory and a link are swapped in one step ([`super::profile_local`]).
//!
//! Spare profiles and the links are never archived ([`crate::stores::archive`]) and are
//! removed with what an earlier process left ([`leftovers_script`]).

use std::path::Path;

use super::command::ALIVE_FN;
use super::shell_quote;
use crate::stores::archive::SPARE_PROFILE_PREFIX;

/// The hand-over made the spare's profile the bot's.
pub const HANDED_OVER: i32 = 0;
/// The bot has a profile (or something else under its name): its own browser starts.
pub const BOT_HAS_PROFILE: i32 = 3;
/// Nothing was renamed (the bot's empty profile directory is back in place).
pub const NOT_RENAMED: i32 = 4;
/// A process of the spare ([`Spare::alive`]) is gone: nothing was renamed, and
/// the spare's desktop is not to be used.
pub const SPARE_GONE: i32 = 7;
/// The profile was renamed but the link could not be made: the spare's browser lost its
/// files and must stop; the bot's browser starts on the renamed (fresh) profile.
pub const LINK_FAILED: i32 = 6;

/// A spare desktop a bot takes, as the hand-over sees it.
#[derive(Clone, Copy, Debug)]
pub struct Spare<'a> {
    /// The spare profile's name in the profiles directory (a checked name).
    pub name: &'a str,
    /// The spare's processes: every one must run for the hand-over.
    pub alive: &'a [u32],
    /// The process group of the spare's browser, which the script holds still while its
    /// profile moves (on this host the profile moves without a hold).
    pub browser: Option<u32>,
}

/// A new spare profile's name.
pub fn spare_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{SPARE_PROFILE_PREFIX}{}", &id[..12])
}

/// Whether `name` is a spare profile's (or a hand-over's link).
pub fn is_spare(name: &str) -> bool {
    name.starts_with(SPARE_PROFILE_PREFIX)
}

/// The script that makes spare profile `spare.name` the profile of `bot` when `bot` has none
/// (no directory, or an empty one), once every process of `spare.alive` is seen running:
/// exits [`HANDED_OVER`], [`BOT_HAS_PROFILE`], [`NOT_RENAMED`], [`SPARE_GONE`] or
/// [`LINK_FAILED`]. Both names are checked ids; `profiles` is the profiles directory.
///
/// It runs on a new bot's way to its desktop, so it starts as few processes as it can: the
/// checks are shell builtins, and on the common path (no directory under the bot's name yet)
/// only `mv` and `ln` run. The spare's path is missing only between the rename and the link,
/// while its browser is held still (the module's doc); the hold ends with the script.
pub fn handover_script(profiles: &Path, bot: &str, spare: &Spare<'_>) -> String {
    let dir = shell_quote(&profiles.to_string_lossy());
    let (s, b) = (shell_quote(spare.name), shell_quote(bot));
    let hold = spare
        .browser
        .map(|group| {
            format!(
                "trap 'kill -CONT -- -{group} 2>/dev/null' EXIT\nkill -STOP -- -{group} 2>/dev/null\n"
            )
        })
        .unwrap_or_default();
    format!(
        "{}[ -L {dir} ] && exit {NOT_RENAMED}\n\
         cd -- {dir} || exit {NOT_RENAMED}\n\
         if [ -d {b} ] && [ ! -L {b} ]; then rmdir -- {b} 2>/dev/null; fi\n\
         if [ -e {b} ] || [ -L {b} ]; then exit {BOT_HAS_PROFILE}; fi\n\
         {hold}if ! mv -T -- {s} {b} 2>/dev/null; then mkdir -p -- {b}; exit {NOT_RENAMED}; fi\n\
         ln -sT -- {b} {s} || exit {LINK_FAILED}\n",
        alive_script(spare.alive)
    )
}

/// Exits [`SPARE_GONE`] unless every process of `alive` runs (a zombie does not); shell
/// builtins only ([`ALIVE_FN`]).
pub fn alive_script(alive: &[u32]) -> String {
    if alive.is_empty() {
        return String::new();
    }
    let pids: Vec<String> = alive.iter().map(u32::to_string).collect();
    format!(
        "{ALIVE_FN}\nfor pid in {}; do alive \"$pid\" || exit {SPARE_GONE}; done\n",
        pids.join(" ")
    )
}

/// The script that removes spare profile or hand-over link `name` (a link goes, never what
/// it points to).
pub fn remove_script(profiles: &Path, name: &str) -> String {
    let path = profiles.join(name);
    format!(
        "[ -L {} ] || rm -rf -- {}\n",
        shell_quote(&profiles.to_string_lossy()),
        shell_quote(&path.to_string_lossy())
    )
}

/// The script that removes every spare profile and link an earlier process left. Neither
/// this nor [`remove_script`] goes through a profiles directory that is itself a link.
pub fn leftovers_script(profiles: &Path) -> String {
    format!(
        "if [ -d {p} ] && [ ! -L {p} ]; then (cd -- {p} && rm -rf -- {SPARE_PROFILE_PREFIX}*); fi\n",
        p = shell_quote(&profiles.to_string_lossy())
    )
}

/// A stand-in for a spare's browser still opening its profile, for the hand-over's tests.
#[cfg(test)]
pub(super) mod writer {
    use std::path::Path;
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    /// A process group of its own (its id is the group's) that makes `dir` over and over, as
    /// a browser opening a database makes its directory by the spare path; returns once it
    /// runs its loop.
    pub fn start(dir: &Path) -> Child {
        use std::os::unix::process::CommandExt;
        let ready = dir.with_extension("ready");
        let child = Command::new("python3")
            .args([
                "-c",
                "import os, sys\nopen(sys.argv[2], 'w').close()\nwhile True:\n    try:\n        os.makedirs(sys.argv[1], exist_ok=True)\n    except OSError:\n        pass\n",
            ])
            .arg(dir)
            .arg(&ready)
            .process_group(0)
            .spawn()
            .expect("python3");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the writer did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    /// Ten hand-overs of `.spare-1` to `bot-a` under the profiles directory of a new
    /// workspace, each while a stand-in browser keeps making `.spare-1/Default/Cache`:
    /// `hand_over` (given the workspace and the spare) must answer [`super::HANDED_OVER`]
    /// every time, leave the link at the spare name and the stand-in's writes in the bot's
    /// profile, and never leave the stand-in stopped.
    pub fn hand_over_rounds(hand_over: impl Fn(&Path, super::Spare<'_>) -> i32) {
        for round in 0..10 {
            let workspace = tempfile::tempdir().unwrap();
            let p = workspace.path().join(crate::desktop::browser::PROFILES_DIR);
            let cache = p.join(".spare-1/Default/Cache");
            std::fs::create_dir_all(&cache).unwrap();
            let mut browser = start(&cache);
            let spare = super::Spare {
                name: ".spare-1",
                alive: &[browser.id()],
                browser: Some(browser.id()),
            };
            let code = hand_over(workspace.path(), spare);
            let state = state(browser.id());
            browser.kill().unwrap();
            browser.wait().unwrap();
            assert_eq!(code, super::HANDED_OVER, "round {round}");
            assert_eq!(
                std::fs::read_link(p.join(".spare-1")).unwrap(),
                Path::new("bot-a"),
                "round {round}"
            );
            assert!(p.join("bot-a/Default/Cache").is_dir(), "round {round}");
            assert_ne!(state, 'T', "round {round}: left stopped");
        }
    }

    /// The process's state letter (`T`: stopped).
    pub fn state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &stat[stat.rfind(") ").unwrap() + 2..];
        after.chars().next().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Spare `.spare-1` with processes `alive` and no browser to hold.
    fn spare(alive: &[u32]) -> Spare<'_> {
        Spare {
            name: ".spare-1",
            alive,
            browser: None,
        }
    }

    fn run(script: &str) -> i32 {
        Command::new("bash")
            .arg("-c")
            .arg(script)
            .status()
            .unwrap()
            .code()
            .unwrap()
    }

    #[test]
    fn spare_names_are_never_bot_ids() {
        let name = spare_name();
        assert!(is_spare(&name));
        assert!(super::super::check_id(&name).is_err());
        assert_ne!(name, spare_name());
    }

    #[test]
    fn a_new_bot_gets_the_spare_profile_and_the_old_path_still_reaches_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        std::fs::write(p.join(".spare-1/Default/Preferences"), b"{}").unwrap();
        std::fs::create_dir(p.join("bot-a")).unwrap();
        assert_eq!(run(&handover_script(p, "bot-a", &spare(&[]))), HANDED_OVER);
        assert!(p.join("bot-a/Default/Preferences").is_file());
        assert!(p.join(".spare-1").symlink_metadata().unwrap().is_symlink());
        // What the running browser writes by its old path lands in the bot's profile.
        std::fs::write(p.join(".spare-1/Default/History"), b"h").unwrap();
        assert!(p.join("bot-a/Default/History").is_file());
        assert!(!p.join(".spare-1.link").exists());
        // Removing the link leaves the profile.
        assert_eq!(run(&remove_script(p, ".spare-1")), 0);
        assert!(p.join(".spare-1").symlink_metadata().is_err());
        assert!(p.join("bot-a/Default/History").is_file());
    }

    /// A browser that keeps opening its profile by the spare path through the hand-over: held
    /// still, it never makes a directory at the spare's name between the rename and the link,
    /// and it runs again after; its writes land in the bot's profile.
    #[test]
    fn a_browser_still_writing_its_profile_is_held_while_it_moves() {
        writer::hand_over_rounds(|workspace, spare| {
            let profiles = workspace.join(crate::desktop::browser::PROFILES_DIR);
            run(&handover_script(&profiles, "bot-a", &spare))
        });
    }

    /// Where a directory appears at the spare's name after the rename, the link is not made
    /// inside it: the hand-over says the link failed.
    #[test]
    fn a_link_is_never_made_inside_a_directory_at_the_spare_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        // `mv` is made to leave a directory behind at the old name.
        let bin = tempfile::tempdir().unwrap();
        let mv = bin.path().join("mv");
        std::fs::write(&mv, "#!/bin/sh\n/bin/mv \"$@\" && mkdir .spare-1\n").unwrap();
        std::fs::set_permissions(&mv, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let script = format!(
            "PATH={}:$PATH\n{}",
            bin.path().display(),
            handover_script(p, "bot-a", &spare(&[]))
        );
        assert_eq!(run(&script), LINK_FAILED);
        assert!(p.join("bot-a/Default").is_dir());
        assert_eq!(std::fs::read_dir(p.join(".spare-1")).unwrap().count(), 0);
    }

    /// The hold ends however the hand-over ends.
    #[test]
    fn a_held_browser_runs_again_when_nothing_was_renamed() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let mut browser = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let taken = Spare {
            name: ".spare-1",
            alive: &[],
            browser: Some(browser.id()),
        };
        // No spare profile to rename.
        assert_eq!(run(&handover_script(p, "bot-a", &taken)), NOT_RENAMED);
        assert_ne!(writer::state(browser.id()), 'T');
        browser.kill().unwrap();
        browser.wait().unwrap();
    }

    #[test]
    fn a_spare_whose_processes_are_gone_is_not_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        let me = std::process::id();
        // No pid reaches the kernel's largest limit (2^22).
        let script = handover_script(p, "bot-a", &spare(&[me, 4_194_304]));
        assert_eq!(run(&script), SPARE_GONE);
        assert!(p.join(".spare-1/Default").is_dir());
        assert!(!p.join("bot-a").exists());
        assert_eq!(
            run(&handover_script(p, "bot-a", &spare(&[me]))),
            HANDED_OVER
        );
    }

    #[test]
    fn a_zombie_is_gone_and_a_name_that_mimics_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        // A live process whose name holds ") Z ": the state is read after the name.
        let named = dir.path().join("a) Z b");
        std::fs::copy("/bin/sleep", &named).unwrap();
        // Another test's child may briefly hold the new file open for writing (ETXTBSY).
        let mut live = (0..50)
            .find_map(|_| {
                let spawned = Command::new(&named).arg("30").spawn();
                if spawned.is_err() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                spawned.ok()
            })
            .expect("start the renamed sleep");
        let mut zombie = Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", zombie.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z ")) {
            assert!(std::time::Instant::now() < deadline, "no zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(run(&format!("{}exit 0", alive_script(&[live.id()]))), 0);
        assert_eq!(
            run(&format!(
                "{}exit 0",
                alive_script(&[live.id(), zombie.id()])
            )),
            SPARE_GONE
        );
        live.kill().unwrap();
        live.wait().unwrap();
        zombie.wait().unwrap();
    }

    #[test]
    fn a_bot_with_a_profile_keeps_it_and_the_spare_stays_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        std::fs::create_dir_all(p.join("bot-a")).unwrap();
        std::fs::write(p.join("bot-a/Saved Cookies.json"), b"[]").unwrap();
        assert_eq!(
            run(&handover_script(p, "bot-a", &spare(&[]))),
            BOT_HAS_PROFILE
        );
        assert!(p.join("bot-a/Saved Cookies.json").is_file());
        assert!(p.join(".spare-1/Default").is_dir());
        // A link planted under the bot's name is not replaced either.
        std::fs::create_dir(p.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(p.join("elsewhere"), p.join("bot-b")).unwrap();
        assert_eq!(
            run(&handover_script(p, "bot-b", &spare(&[]))),
            BOT_HAS_PROFILE
        );
        assert!(p.join(".spare-1/Default").is_dir());
        // A lost spare profile renames nothing and leaves the bot an empty profile.
        std::fs::remove_dir_all(p.join(".spare-1")).unwrap();
        assert_eq!(run(&handover_script(p, "bot-c", &spare(&[]))), NOT_RENAMED);
        assert!(p.join("bot-c").is_dir());
        assert!(p.join(".spare-1.link").symlink_metadata().is_err());
    }

    #[test]
    fn leftovers_go_and_bots_profiles_stay() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        std::fs::create_dir_all(p.join("bot-a/Default")).unwrap();
        std::os::unix::fs::symlink("bot-a", p.join(".spare-2")).unwrap();
        assert_eq!(run(&leftovers_script(p)), 0);
        assert!(!p.join(".spare-1").exists());
        assert!(p.join(".spare-2").symlink_metadata().is_err());
        assert!(p.join("bot-a/Default").is_dir());
        // No profiles directory yet: nothing to do.
        assert_eq!(run(&leftovers_script(&p.join("none"))), 0);
        // A profiles directory that is a link elsewhere is not gone through.
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(outside.path().join(".spare-x")).unwrap();
        std::os::unix::fs::symlink(outside.path(), p.join("linked")).unwrap();
        assert_eq!(run(&leftovers_script(&p.join("linked"))), 0);
        run(&remove_script(&p.join("linked"), ".spare-x"));
        assert!(outside.path().join(".spare-x").is_dir());
    }
}
