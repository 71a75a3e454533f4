//! The fake machine's emulated shell: a small POSIX subset over the in-memory tree.
//!
//! Supported: `;`, `&&`, `||`; single and double quotes; `$VAR` and `${VAR}`; `>`, `>>`,
//! `2>&1`, `>&2` and `< file`; the builtins `echo [-n]`, `printf FORMAT [ARGS]`, `cat`, `ls`,
//! `pwd`, `cd DIR`, `mkdir [-p]`, `test` and `[ ... ]` with `-d`, `-f` or `-e PATH`, `touch`, `rm [-r] [-f]`, `ln [-s] TARGET NAME`, `mkfifo NAME`, `true`,
//! `false`, `exit N`, `sleep SECONDS`, `whoami`, `env`. Unknown commands answer 127 like a
//! shell does. A hard link can only name a file of this machine (another file system is
//! "Invalid cross-device link", as on a real computer); the shell does not follow links.

use std::collections::BTreeMap;

use crate::providers::workspace_path::{normalize, resolve};

use super::tree::{Node, Tree};

/// How a list element is joined to the previous one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Join {
    Always,
    And,
    Or,
}

/// One parsed simple command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Simple {
    /// Words after expansion.
    pub argv: Vec<String>,
    /// `> file` or `>> file` target and whether it appends.
    pub stdout_to: Option<(String, bool)>,
    /// `2>&1`.
    pub stderr_to_stdout: bool,
    /// `>&2` / `1>&2`.
    pub stdout_to_stderr: bool,
    /// `< file`.
    pub stdin_from: Option<String>,
}

/// A step the interpreter asks its caller to perform (time passes outside the tree lock).
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Output of one finished simple command and its status.
    Done {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        status: i32,
    },
    /// `sleep`: wait this many seconds, then status 0.
    Sleep(f64),
    /// `exit N`: stop the whole command line.
    Exit(i32),
    /// `cd DIR`: the rest of the command line runs in this workspace directory.
    Cd(String),
}

/// Split a command line into joined simple commands (not yet expanded).
fn split_list(line: &str) -> Result<Vec<(Join, String)>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut join = Join::Always;
    let (mut single, mut double) = (false, false);
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
        if !single && !double {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            if two == "&&" || two == "||" {
                out.push((join, std::mem::take(&mut cur)));
                join = if two == "&&" { Join::And } else { Join::Or };
                i += 2;
                continue;
            }
            if c == ';' || c == '\n' {
                out.push((join, std::mem::take(&mut cur)));
                join = Join::Always;
                i += 1;
                continue;
            }
        }
        cur.push(c);
        i += 1;
    }
    if single || double {
        return Err("unterminated quote".into());
    }
    out.push((join, cur));
    Ok(out
        .into_iter()
        .filter(|(_, s)| !s.trim().is_empty())
        .collect())
}

fn expand_var(chars: &[char], i: &mut usize, env: &BTreeMap<String, String>, out: &mut String) {
    // chars[*i] == '$'
    let mut name = String::new();
    if chars.get(*i + 1) == Some(&'{') {
        *i += 2;
        while *i < chars.len() && chars[*i] != '}' {
            name.push(chars[*i]);
            *i += 1;
        }
        *i += 1;
    } else {
        *i += 1;
        while *i < chars.len() && (chars[*i].is_ascii_alphanumeric() || chars[*i] == '_') {
            name.push(chars[*i]);
            *i += 1;
        }
        if name.is_empty() {
            out.push('$');
            return;
        }
    }
    out.push_str(env.get(&name).map(String::as_str).unwrap_or(""));
}

/// Tokenize and expand one simple command.
pub fn parse_simple(src: &str, env: &BTreeMap<String, String>) -> Result<Simple, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut words: Vec<String> = Vec::new();
    let mut cur: Option<String> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => {
                words.extend(cur.take());
                i += 1;
            }
            '\'' => {
                let w = cur.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    w.push(chars[i]);
                    i += 1;
                }
                i += 1;
            }
            '"' => {
                let w = cur.get_or_insert_with(String::new);
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '$' {
                        expand_var(&chars, &mut i, env, w);
                    } else if chars[i] == '\\'
                        && i + 1 < chars.len()
                        && matches!(chars[i + 1], '"' | '\\' | '$')
                    {
                        w.push(chars[i + 1]);
                        i += 2;
                    } else {
                        w.push(chars[i]);
                        i += 1;
                    }
                }
                i += 1;
            }
            '$' => expand_var(&chars, &mut i, env, cur.get_or_insert_with(String::new)),
            '\\' if i + 1 < chars.len() => {
                cur.get_or_insert_with(String::new).push(chars[i + 1]);
                i += 2;
            }
            '>' | '<' => {
                // A file descriptor's number only right before `>` (`2>&1`); `echo 1 > f`
                // prints 1.
                let fd = match cur.as_deref() {
                    Some("1" | "2") if c == '>' => cur.take(),
                    _ => None,
                };
                words.extend(cur.take());
                let mut op = fd.unwrap_or_default();
                op.push(c);
                i += 1;
                if c == '>' && chars.get(i) == Some(&'>') {
                    op.push('>');
                    i += 1;
                } else if c == '>'
                    && chars.get(i) == Some(&'&')
                    && matches!(chars.get(i + 1), Some('1' | '2'))
                {
                    op.extend(&chars[i..i + 2]);
                    i += 2;
                }
                words.push(op);
            }
            _ => {
                cur.get_or_insert_with(String::new).push(c);
                i += 1;
            }
        }
    }
    words.extend(cur.take());
    // Redirections, each an operator word (with its file descriptor's number, if any).
    let mut simple = Simple::default();
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            ">" | ">>" | "1>" | "1>>" => {
                let target = it.next().ok_or("missing redirection target")?;
                simple.stdout_to = Some((target, w.ends_with(">>")));
            }
            "<" => simple.stdin_from = Some(it.next().ok_or("missing redirection source")?),
            ">&2" | "1>&2" => simple.stdout_to_stderr = true,
            ">&1" | "1>&1" | "2>&2" => {}
            "2>&1" => simple.stderr_to_stdout = true,
            // stderr to a file: the emulator discards it.
            "2>" | "2>>" => {
                it.next().ok_or("missing redirection target")?;
            }
            _ => simple.argv.push(w),
        }
    }
    Ok(simple)
}

/// Parse a whole line into joined simple commands.
pub fn parse(
    line: &str,
    env: &BTreeMap<String, String>,
) -> Result<Vec<(bool, bool, Simple)>, String> {
    split_list(line)?
        .into_iter()
        .map(|(join, src)| {
            Ok((
                join == Join::And,
                join == Join::Or,
                parse_simple(&src, env)?,
            ))
        })
        .collect()
}

/// A path argument from `cwd`: `..` goes up a name, but never above the workspace; absolute
/// paths are outside the emulated workspace.
fn path_arg(cwd: &str, arg: &str) -> Result<String, String> {
    if arg.starts_with('/') {
        return normalize(arg, true).map_err(|e| e.to_string());
    }
    resolve(cwd, arg, true).map_err(|e| e.to_string())
}

fn printf(format: &str, args: &[String]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(o) => out.push(o),
                None => out.push('\\'),
            },
            '%' => match chars.next() {
                Some('s') | Some('d') => {
                    out.push_str(args.next().map(String::as_str).unwrap_or(""))
                }
                Some('%') => out.push('%'),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            },
            c => out.push(c),
        }
    }
    out
}

/// Run one simple command against the tree. Time-taking and exiting builtins come back as
/// [`Step::Sleep`] / [`Step::Exit`] for the caller to perform.
pub fn run_simple(
    tree: &mut Tree,
    cwd: &str,
    env: &BTreeMap<String, String>,
    cmd: &Simple,
) -> Step {
    let fail = |msg: String, status: i32| Step::Done {
        stdout: Vec::new(),
        stderr: msg.into_bytes(),
        status,
    };
    // Leading `NAME=value` words set the command's environment; the emulator's builtins read
    // none of it, so they are dropped.
    let assignment = |w: &&String| {
        w.split_once('=').is_some_and(|(k, _)| {
            k.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    let argv: Vec<String> = cmd.argv.iter().skip_while(assignment).cloned().collect();
    let Some(name) = argv.first() else {
        return Step::Done {
            stdout: vec![],
            stderr: vec![],
            status: 0,
        };
    };
    let args = &argv[1..];
    let stdin = match &cmd.stdin_from {
        Some(src) => match path_arg(cwd, src)
            .and_then(|p| tree.read(&p).map(|b| b.to_vec()).map_err(|_| p))
        {
            Ok(bytes) => Some(bytes),
            Err(p) => return fail(format!("{p}: No such file or directory\n"), 1),
        },
        None => None,
    };
    let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), 0);
    match name.as_str() {
        "true" | ":" => {}
        "false" => status = 1,
        "[" | "test" => {
            let operands = match (name.as_str(), args.split_last()) {
                ("[", Some((last, rest))) if last == "]" => rest,
                ("[", _) => return fail("sh: [: missing ]\n".into(), 2),
                _ => args,
            };
            let found = |p: &String| path_arg(cwd, p).ok().and_then(|p| tree.get(&p));
            status = match operands {
                [op, path] if op == "-d" => i32::from(!matches!(found(path), Some(Node::Dir))),
                [op, path] if op == "-f" => i32::from(!matches!(
                    found(path),
                    Some(Node::File(_) | Node::HardLinked(_))
                )),
                [op, path] if op == "-e" => i32::from(found(path).is_none()),
                _ => return fail("sh: test: only -d, -f and -e PATH\n".into(), 2),
            };
        }
        "exit" => return Step::Exit(args.first().and_then(|a| a.parse().ok()).unwrap_or(0)),
        "sleep" => return Step::Sleep(args.first().and_then(|a| a.parse().ok()).unwrap_or(0.0)),
        "echo" => {
            let (newline, words) = match args.first().map(String::as_str) {
                Some("-n") => (false, &args[1..]),
                _ => (true, args),
            };
            stdout.extend(words.join(" ").into_bytes());
            if newline {
                stdout.push(b'\n');
            }
        }
        "printf" => stdout.extend(
            printf(
                args.first().map(String::as_str).unwrap_or(""),
                &args[1.min(args.len())..],
            )
            .into_bytes(),
        ),
        "pwd" => stdout.extend(
            format!("/workspace{}{cwd}\n", if cwd.is_empty() { "" } else { "/" }).into_bytes(),
        ),
        "whoami" => stdout.extend(b"rakazo\n"),
        "env" => {
            for (k, v) in env {
                stdout.extend(format!("{k}={v}\n").into_bytes());
            }
        }
        "cat" => {
            if args.is_empty() {
                stdout.extend(stdin.unwrap_or_default());
            }
            for a in args {
                match path_arg(cwd, a) {
                    Ok(p) => match tree.read(&p) {
                        Ok(bytes) => stdout.extend_from_slice(bytes),
                        Err(_) => {
                            stderr.extend(
                                format!("cat: {a}: No such file or directory\n").into_bytes(),
                            );
                            status = 1;
                        }
                    },
                    Err(e) => return fail(format!("cat: {e}\n"), 1),
                }
            }
        }
        "ls" => {
            let target = args
                .iter()
                .find(|a| !a.starts_with('-'))
                .map(String::as_str)
                .unwrap_or(".");
            let target = if target == "." {
                String::new()
            } else {
                target.to_owned()
            };
            match path_arg(cwd, &target) {
                Ok(p) => match tree.get(&p) {
                    Some(Node::File(_)) => stdout.extend(format!("{target}\n").into_bytes()),
                    _ => match tree.list(&p) {
                        Ok(entries) => {
                            for e in entries.iter().filter(|e| !e.name.starts_with('.')) {
                                stdout.extend(format!("{}\n", e.name).into_bytes());
                            }
                        }
                        Err(_) => {
                            return fail(
                                format!(
                                    "ls: cannot access '{target}': No such file or directory\n"
                                ),
                                2,
                            );
                        }
                    },
                },
                Err(e) => return fail(format!("ls: {e}\n"), 2),
            }
        }
        "cd" => {
            let target = args.first().map_or("", String::as_str);
            return match path_arg(cwd, target) {
                // The workspace root is always there; the shell does not follow links.
                Ok(dir) if dir.is_empty() || matches!(tree.get(&dir), Some(Node::Dir)) => {
                    Step::Cd(dir)
                }
                _ => fail(format!("sh: cd: {target}: No such file or directory\n"), 1),
            };
        }
        "mkdir" => {
            for a in args.iter().filter(|a| !a.starts_with('-')) {
                match path_arg(cwd, a).map(|p| tree.mkdir_all(&p)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return fail(format!("mkdir: {e}\n"), 1),
                    Err(e) => return fail(format!("mkdir: {e}\n"), 1),
                }
            }
        }
        "touch" => {
            for a in args {
                match path_arg(cwd, a) {
                    Ok(p) if tree.get(&p).is_none() => {
                        if let Err(e) = tree.write(&p, Vec::new()) {
                            return fail(format!("touch: {e}\n"), 1);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return fail(format!("touch: {e}\n"), 1),
                }
            }
        }
        "rm" => {
            let force = args.iter().any(|a| a.starts_with('-') && a.contains('f'));
            for a in args.iter().filter(|a| !a.starts_with('-')) {
                match path_arg(cwd, a) {
                    Ok(p) if !p.is_empty() => {
                        if !tree.remove(&p) && !force {
                            stderr.extend(
                                format!("rm: cannot remove '{a}': No such file or directory\n")
                                    .into_bytes(),
                            );
                            status = 1;
                        }
                    }
                    _ => return fail(format!("rm: refusing to remove '{a}'\n"), 1),
                }
            }
        }
        "ln" => {
            let symbolic = args.iter().any(|a| a.starts_with('-') && a.contains('s'));
            let words: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
            let [target, name] = words[..] else {
                return fail("ln: missing file operand\n".into(), 1);
            };
            let made = match path_arg(cwd, name) {
                Err(e) => Err(e),
                Ok(link) if symbolic => tree.plant(&link, Node::Symlink(target.clone())),
                Ok(link) => match path_arg(cwd, target) {
                    Ok(source) => tree.hard_link(&source, &link),
                    Err(_) => Err("Invalid cross-device link".into()),
                },
            };
            if let Err(e) = made {
                return fail(format!("ln: failed to create link '{name}': {e}\n"), 1);
            }
        }
        "mkfifo" => {
            for a in args.iter().filter(|a| !a.starts_with('-')) {
                if let Err(e) = path_arg(cwd, a).and_then(|p| tree.plant(&p, Node::Fifo)) {
                    return fail(format!("mkfifo: cannot create fifo '{a}': {e}\n"), 1);
                }
            }
        }
        other => return fail(format!("{other}: command not found\n"), 127),
    }
    if cmd.stderr_to_stdout {
        stdout.append(&mut stderr);
    }
    if cmd.stdout_to_stderr {
        stderr.append(&mut stdout);
    }
    if let Some((target, append)) = &cmd.stdout_to {
        let written = path_arg(cwd, target)
            .map_err(|e| e.to_string())
            .and_then(|p| {
                let data = std::mem::take(&mut stdout);
                if *append {
                    tree.append(&p, &data)
                } else {
                    tree.write(&p, data)
                }
                .map_err(|e| e.to_string())
            });
        if let Err(e) = written {
            return fail(format!("sh: {target}: {e}\n"), 1);
        }
    }
    Step::Done {
        stdout,
        stderr,
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tree: &mut Tree, line: &str) -> (String, String, i32) {
        let env = BTreeMap::from([("NAME".to_owned(), "rakazo".to_owned())]);
        let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), 0);
        for (and, or, cmd) in parse(line, &env).unwrap() {
            if (and && status != 0) || (or && status == 0) {
                continue;
            }
            match run_simple(tree, "", &env, &cmd) {
                Step::Done {
                    stdout,
                    stderr,
                    status: s,
                } => {
                    out.extend(stdout);
                    err.extend(stderr);
                    status = s;
                }
                Step::Exit(code) => {
                    return (
                        String::from_utf8(out).unwrap(),
                        String::from_utf8(err).unwrap(),
                        code,
                    );
                }
                Step::Sleep(_) | Step::Cd(_) => status = 0,
            }
        }
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
            status,
        )
    }

    #[test]
    fn quoting_expansion_and_lists() {
        let mut t = Tree::default();
        assert_eq!(
            run(&mut t, "echo 'a  b' \"hi $NAME\" ${NAME}").0,
            "a  b hi rakazo rakazo\n"
        );
        assert_eq!(run(&mut t, "false && echo no || echo yes").0, "yes\n");
        assert_eq!(run(&mut t, "echo one; echo two").0, "one\ntwo\n");
        assert_eq!(run(&mut t, "nope").2, 127);
        assert_eq!(run(&mut t, "exit 4; echo never").2, 4);
    }

    #[test]
    fn redirections_touch_the_tree() {
        let mut t = Tree::default();
        run(&mut t, "mkdir -p d && echo x > d/f && echo y >> d/f");
        assert_eq!(run(&mut t, "cat d/f").0, "x\ny\n");
        assert_eq!(run(&mut t, "cat < d/f").0, "x\ny\n");
        assert_eq!(run(&mut t, "echo e >&2").1, "e\n");
        assert_eq!(
            run(&mut t, "cat missing 2>&1").0,
            "cat: missing: No such file or directory\n"
        );
        assert_eq!(run(&mut t, "echo x > ../../etc/passwd").2, 1);
        // A digit apart from `>` is an argument, one right before it a file descriptor.
        run(
            &mut t,
            "echo 1 > one; echo 2 > two; echo 3 1> three; echo 4 2> four",
        );
        assert_eq!(run(&mut t, "cat one two three four").0, "1\n2\n3\n");
        assert_eq!(run(&mut t, "echo e 1>&2").1, "e\n");
        assert_eq!(run(&mut t, "cat missing 2>>log").0, "");
    }

    #[test]
    fn tests_of_paths() {
        let mut t = Tree::default();
        run(&mut t, "mkdir -p d && touch d/f && ln -s d l");
        assert_eq!(run(&mut t, "[ -d d ] && echo dir").0, "dir\n");
        assert_eq!(run(&mut t, "[ -d d/f ] || echo not").0, "not\n");
        assert_eq!(run(&mut t, "test -f d/f && echo file").0, "file\n");
        assert_eq!(run(&mut t, "[ -e nope ] || echo none").0, "none\n");
        // Links are never followed.
        assert_eq!(run(&mut t, "[ -d l ] || echo link").0, "link\n");
        assert_eq!(run(&mut t, "[ -d d").2, 2);
        assert_eq!(
            run(&mut t, "[ -d x ] || mkdir -p x; cd x || exit 1\necho in").0,
            "in\n"
        );
        assert_eq!(run(&mut t, "[ -d x ] && echo made").0, "made\n");
    }
}
