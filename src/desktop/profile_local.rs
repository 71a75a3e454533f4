//! Readying a bot's browser profile, and handing a spare's profile over, by system calls in this
//! process: what the profile script does, for desktops on this host (no process starts).
//!
//! A new bot's desktop taken from a spare waits for exactly this work, and eight bots opening
//! at once each ran a `bash` with `mv` and `ln` for it (about 5 ms of CPU each on the 2 cores
//! of the reference machine). Here it is a dozen system calls.
//!
//! Every name is looked at and changed from the profiles directory, opened without following a
//! link, and inside it without following one either: a link the bot planted under its
//! profile's name, at `Default` or at a lock file is never gone through by this process (a
//! planted lock link is removed as the link it is). Whatever this path does not expect (the
//! profiles directory or the bot's profile being a link, an entry of another kind, an error, a
//! filesystem that cannot swap two names) answers `None` before the hand-over takes effect,
//! having changed at most what the script then changes the same way (a lock file removed),
//! and the caller runs the script
//! ([`super::spare_profile`]), a process of its own like the bot's programs, whose answers are
//! the same.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::browser::{LOCK_FILES, PROFILES_DIR};
use super::spare_profile::{BOT_HAS_PROFILE, HANDED_OVER, NOT_RENAMED, SPARE_GONE, Spare};
use crate::providers::beneath;

/// What readying a profile found and did (the profile script's three answers).
#[derive(Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The profile had no browser state yet (no `Default` directory).
    pub fresh: bool,
    /// The effective user id browsers here run as.
    pub uid: u32,
    /// How the hand-over of a spare's profile went, as the hand-over script's exit code;
    /// `None`: none was asked for.
    pub handover: Option<i32>,
}

/// What an entry of a directory is, seen without following a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Missing,
    Dir,
    Other,
}

fn entry(dir: impl AsFd, name: &str) -> Result<Entry, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => Ok(Entry::Dir),
        Ok(_) => Ok(Entry::Other),
        Err(Errno::NOENT) => Ok(Entry::Missing),
        Err(e) => Err(e),
    }
}

/// How directories are opened: never through a link at the last name.
const DIR: OFlags = OFlags::DIRECTORY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::RDONLY)
    .union(OFlags::CLOEXEC);

fn open_dir(dir: impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(dir, name, DIR, Mode::empty())
}

/// Whether process `pid` runs (a zombie or a dead one does not): its state, the first field
/// after the last `)` of `/proc/<pid>/stat` (a process name may hold spaces and parentheses).
/// One read of the line's start is enough: the name is at most 15 bytes and what follows the
/// state holds no parenthesis, so the last `) ` read is the name's end.
pub fn alive(pid: u32) -> bool {
    use std::io::Read;
    let mut head = [0u8; 128];
    let Ok(n) =
        std::fs::File::open(format!("/proc/{pid}/stat")).and_then(|mut f| f.read(&mut head))
    else {
        return false;
    };
    let head = &head[..n];
    head.windows(2)
        .rposition(|w| w == b") ")
        .and_then(|end| head.get(end + 2))
        .is_some_and(|&state| state != b'Z' && state != b'X')
}

/// Readies `bot_id`'s profile under `workspace` as the profile script does: says whether it is
/// fresh, removes the lock and port files an earlier browser left, hands `spare`'s profile
/// over when the bot has none, and makes the profile's directory when it is missing. `None`:
/// something this path does not handle was found before the hand-over; run the script
/// instead.
pub fn prepare(workspace: &Path, bot_id: &str, spare: Option<Spare<'_>>) -> Option<Prepared> {
    // The workspace is named by this process; its profiles directory is the bot's, opened
    // as every workspace path is ([`beneath`]).
    let root = rustix::fs::open(workspace, DIR, Mode::empty()).ok()?;
    let profiles = match beneath::open_beneath(root.as_fd(), PROFILES_DIR, DIR, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            // The workspace's first profile: its directory is made as `mkdir -p` would.
            match rustix::fs::mkdirat(&root, PROFILES_DIR, Mode::from_raw_mode(0o777)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(_) => return None,
            }
            beneath::open_beneath(root.as_fd(), PROFILES_DIR, DIR, Mode::empty()).ok()?
        }
        Err(_) => return None,
    };
    let (fresh, profile) = match entry(&profiles, bot_id).ok()? {
        Entry::Missing => (true, None),
        Entry::Dir => {
            let profile = open_dir(&profiles, bot_id).ok()?;
            match entry(&profile, "Default").ok()? {
                Entry::Dir => (false, Some(profile)),
                Entry::Missing => (true, Some(profile)),
                Entry::Other => return None,
            }
        }
        Entry::Other => return None,
    };
    if let Some(profile) = &profile {
        for lock in LOCK_FILES {
            match rustix::fs::unlinkat(profile, lock, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(_) => return None,
            }
        }
    }
    let uid = rustix::process::geteuid().as_raw();
    let handover = match spare {
        Some(spare) => Some(hand_over(
            &profiles,
            bot_id,
            fresh,
            profile.is_some(),
            &spare,
        )?),
        None => None,
    };
    if handover != Some(HANDED_OVER) {
        match rustix::fs::mkdirat(&profiles, bot_id, Mode::from_raw_mode(0o777)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(_) => return None,
        }
    }
    Some(Prepared {
        fresh,
        uid,
        handover,
    })
}

/// [`super::spare_profile::handover_script`], in `profiles`, without its hold: the spare's
/// path reaches the profile at every moment, so its browser, which may still be opening parts
/// of it by that path ([`super::spare_profile`]), is never stopped. A link to the bot's name is
/// made at the bot's name first (it points to itself and nothing goes through it), then
/// swapped with the spare's directory in one step (`RENAME_EXCHANGE`): the directory is the
/// bot's profile, the link stands at the spare's name. `has_dir`: the bot's profile name was a
/// directory when [`prepare`] looked (else there was nothing at it). `None`: the filesystem
/// cannot swap names; nothing changed, and the script hands over instead.
fn hand_over(
    profiles: &OwnedFd,
    bot_id: &str,
    fresh: bool,
    has_dir: bool,
    spare: &Spare<'_>,
) -> Option<i32> {
    if !spare.alive.iter().all(|pid| alive(*pid)) {
        return Some(SPARE_GONE);
    }
    if !fresh {
        return Some(BOT_HAS_PROFILE);
    }
    // The bot's empty profile directory goes; one holding anything stays the bot's. A name
    // that was free needs no second look: the link is never made over what appeared.
    if has_dir {
        let _ = rustix::fs::unlinkat(profiles, bot_id, AtFlags::REMOVEDIR);
        if entry(profiles, bot_id) != Ok(Entry::Missing) {
            return Some(BOT_HAS_PROFILE);
        }
    }
    if rustix::fs::symlinkat(bot_id, profiles, bot_id).is_err() {
        return Some(NOT_RENAMED);
    }
    match rustix::fs::renameat_with(
        profiles,
        spare.name,
        profiles,
        bot_id,
        RenameFlags::EXCHANGE,
    ) {
        Ok(()) => Some(HANDED_OVER),
        Err(e) => {
            let _ = rustix::fs::unlinkat(profiles, bot_id, AtFlags::empty());
            (e != Errno::INVAL).then_some(NOT_RENAMED)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profiles(dir: &Path) -> std::path::PathBuf {
        dir.join(PROFILES_DIR)
    }

    #[test]
    fn a_first_profile_is_made_with_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let got = prepare(dir.path(), "bot-a", None).unwrap();
        assert!(got.fresh);
        assert_eq!(got.handover, None);
        assert_eq!(got.uid, rustix::process::geteuid().as_raw());
        assert!(profiles(dir.path()).join("bot-a").is_dir());
    }

    #[test]
    fn an_existing_profile_loses_its_locks_and_keeps_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = profiles(dir.path()).join("bot-a");
        std::fs::create_dir_all(p.join("Default")).unwrap();
        std::fs::write(p.join("Default/Cookies"), b"c").unwrap();
        std::fs::write(p.join("DevToolsActivePort"), b"9222").unwrap();
        std::os::unix::fs::symlink("host-123", p.join("SingletonLock")).unwrap();
        let got = prepare(dir.path(), "bot-a", None).unwrap();
        assert!(!got.fresh);
        assert!(p.join("Default/Cookies").is_file());
        assert!(p.join("DevToolsActivePort").symlink_metadata().is_err());
        assert!(p.join("SingletonLock").symlink_metadata().is_err());
    }

    #[test]
    fn a_new_bot_takes_the_spare_profile_and_the_old_path_still_reaches_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = profiles(dir.path());
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        std::fs::write(p.join(".spare-1/Default/Preferences"), b"{}").unwrap();
        let me = std::process::id();
        let spare = Spare {
            name: ".spare-1",
            alive: &[me],
            browser: None,
        };
        let got = prepare(dir.path(), "bot-a", Some(spare)).unwrap();
        assert_eq!(got.handover, Some(HANDED_OVER));
        assert!(got.fresh);
        assert!(p.join("bot-a/Default/Preferences").is_file());
        assert_eq!(
            std::fs::read_link(p.join(".spare-1")).unwrap(),
            Path::new("bot-a")
        );
    }

    #[test]
    fn a_spare_whose_processes_are_gone_is_not_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = profiles(dir.path());
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        let spare = Spare {
            name: ".spare-1",
            alive: &[std::process::id(), 4_194_304],
            browser: None,
        };
        let got = prepare(dir.path(), "bot-a", Some(spare)).unwrap();
        assert_eq!(got.handover, Some(SPARE_GONE));
        assert!(p.join(".spare-1/Default").is_dir());
        assert!(p.join("bot-a").is_dir());
        assert!(!p.join("bot-a/Default").exists());
    }

    #[test]
    fn a_bot_with_a_profile_keeps_it_and_the_spare_stays() {
        let dir = tempfile::tempdir().unwrap();
        let p = profiles(dir.path());
        std::fs::create_dir_all(p.join(".spare-1/Default")).unwrap();
        std::fs::create_dir_all(p.join("bot-a/Default")).unwrap();
        // A directory holding something but no `Default` is the bot's too.
        std::fs::create_dir_all(p.join("bot-b")).unwrap();
        std::fs::write(p.join("bot-b/Local State"), b"{}").unwrap();
        for bot in ["bot-a", "bot-b"] {
            let spare = Spare {
                name: ".spare-1",
                alive: &[],
                browser: None,
            };
            let got = prepare(dir.path(), bot, Some(spare)).unwrap();
            assert_eq!(got.handover, Some(BOT_HAS_PROFILE), "{bot}");
        }
        assert!(p.join(".spare-1/Default").is_dir());
        assert!(p.join("bot-b/Local State").is_file());
        // A lost spare profile renames nothing and leaves the bot an empty profile.
        std::fs::remove_dir_all(p.join(".spare-1")).unwrap();
        let spare = Spare {
            name: ".spare-1",
            alive: &[],
            browser: None,
        };
        let got = prepare(dir.path(), "bot-c", Some(spare)).unwrap();
        assert_eq!(got.handover, Some(NOT_RENAMED));
        assert!(p.join("bot-c").is_dir());
        assert!(p.join(".spare-1").symlink_metadata().is_err());
    }

    /// A browser that keeps opening its profile by the spare path through the hand-over always
    /// reaches it: its writes land in the bot's profile, and it is never stopped.
    #[test]
    fn a_browser_still_writing_its_profile_reaches_it_through_the_swap() {
        crate::desktop::spare_profile::writer::hand_over_rounds(|workspace, spare| {
            prepare(workspace, "bot-a", Some(spare))
                .unwrap()
                .handover
                .unwrap()
        });
    }

    /// The bot controls everything under its profile: links it planted are never gone
    /// through; where one stands in the way this path changes nothing and leaves the script
    /// to answer.
    #[test]
    fn links_the_bot_planted_are_never_gone_through_here() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("SingletonLock");
        std::fs::write(&victim, b"keep").unwrap();
        std::fs::create_dir(outside.path().join("Default")).unwrap();
        let p = profiles(dir.path());
        std::fs::create_dir_all(&p).unwrap();
        // The bot's profile is a link to a directory elsewhere.
        std::os::unix::fs::symlink(outside.path(), p.join("bot-a")).unwrap();
        assert_eq!(prepare(dir.path(), "bot-a", None), None);
        assert!(victim.is_file());
        // `Default` is a link: nothing is removed through the profile either.
        std::fs::create_dir(p.join("bot-b")).unwrap();
        std::fs::write(p.join("bot-b/SingletonCookie"), b"c").unwrap();
        std::os::unix::fs::symlink(outside.path().join("Default"), p.join("bot-b/Default"))
            .unwrap();
        assert_eq!(prepare(dir.path(), "bot-b", None), None);
        assert!(p.join("bot-b/SingletonCookie").is_file());
        // A lock that is a link is removed as a link; what it points to stays.
        std::fs::create_dir(p.join("bot-c")).unwrap();
        std::os::unix::fs::symlink(&victim, p.join("bot-c/SingletonLock")).unwrap();
        assert!(prepare(dir.path(), "bot-c", None).is_some());
        assert!(victim.is_file());
        // The profiles directory itself a link: the script's turn.
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), other.path().join(PROFILES_DIR)).unwrap();
        assert_eq!(prepare(other.path(), "bot-d", None), None);
        assert!(!outside.path().join("bot-d").exists());
    }

    #[test]
    fn a_zombie_is_not_alive_and_a_running_process_is() {
        assert!(alive(std::process::id()));
        assert!(!alive(4_194_304));
        let mut zombie = std::process::Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", zombie.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z ")) {
            assert!(std::time::Instant::now() < deadline, "no zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!alive(zombie.id()));
        zombie.wait().unwrap();
    }

    #[test]
    fn a_name_that_looks_like_a_state_is_read_as_a_name() {
        // The longest name the kernel keeps (15 bytes), parentheses and a zombie's state in it:
        // a process takes the name it was started by, here a link (a copy of the program
        // could meet `ETXTBSY` while another test's child still holds it open for writing).
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join(") Z ) X (a) Z b");
        std::os::unix::fs::symlink("/bin/sleep", &program).unwrap();
        let mut sleeper = std::process::Command::new(&program)
            .arg("30")
            .spawn()
            .unwrap();
        let stat = format!("/proc/{}/stat", sleeper.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains("(a) Z b) S")) {
            assert!(
                std::time::Instant::now() < deadline,
                "the copy did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(alive(sleeper.id()));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
    }
}
