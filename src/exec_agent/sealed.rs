//! The sealed lines of an exec agent reached through a socket others can reach too
//! (`agent.py --listen`, in the screen gateway's directory): every line each way begins with
//! its HMAC-SHA256 under the key the agent handed to the command that started it, over its
//! direction, its number in that direction and the line. Whoever else reaches the socket (the
//! bot, the same uid, can) can neither ask in this process's place nor answer in the agent's:
//! a forged, reordered, repeated or missing line ends the channel.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use super::{Channel, MAX_LINE};

type HmacSha256 = Hmac<Sha256>;

/// The key an agent hands out: 32 bytes.
pub type Key = [u8; 32];
/// Requests (this process to the agent).
const REQUEST: u8 = b'q';
/// Answers (the agent to this process).
const ANSWER: u8 = b'a';
/// A seal in hex and the space after it.
const SEAL_LEN: usize = 65;
/// Bytes between the two ends of a sealed channel's in-process pipe.
const PIPE: usize = 64 << 10;

/// The MAC of line `number` of `direction`.
fn mac(key: &Key, direction: u8, number: u64, body: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(&[direction]);
    mac.update(&number.to_be_bytes());
    mac.update(body);
    mac
}

/// `body` (a line without its end) sealed as line `number` of `direction`, with its end.
fn seal(key: &Key, direction: u8, number: u64, body: &[u8]) -> Vec<u8> {
    let tag = hex::encode(mac(key, direction, number, body).finalize().into_bytes());
    let mut line = Vec::with_capacity(SEAL_LEN + body.len() + 1);
    line.extend_from_slice(tag.as_bytes());
    line.push(b' ');
    line.extend_from_slice(body);
    line.push(b'\n');
    line
}

/// The body of `line` (without its end) when it is sealed as line `number` of `direction`.
fn open(key: &Key, direction: u8, number: u64, line: &[u8]) -> Option<Vec<u8>> {
    let (tag, body) = (line.get(..SEAL_LEN - 1)?, line.get(SEAL_LEN..)?);
    if line[SEAL_LEN - 1] != b' ' {
        return None;
    }
    let tag = hex::decode(tag).ok()?;
    mac(key, direction, number, body)
        .verify_slice(&tag)
        .ok()
        .map(|()| body.to_vec())
}

/// A key as the agent prints it (64 hex digits).
pub fn key_from_hex(text: &str) -> Option<Key> {
    hex::decode(text.trim()).ok()?.try_into().ok()
}

/// Cancels a sealed channel's tasks when the channel is given up.
struct Tasks([tokio::task::AbortHandle; 2]);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The agent's channel over `stream` (see the module's doc): the requests written to it are
/// sealed, the answers read from it are those whose seal held, up to the first that did not
/// (then its output ends and the agent counts as ended). Dropping the channel closes `stream`.
pub fn channel<S>(stream: S, key: Key) -> Channel
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (from_agent, mut to_agent) = tokio::io::split(stream);
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let (requests, mut answers) = tokio::io::split(theirs);
    let sealing = tokio::spawn(async move {
        let mut requests = BufReader::new(requests);
        let mut line = Vec::new();
        for number in 0u64.. {
            line.clear();
            match requests.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let body = line.strip_suffix(b"\n").unwrap_or(&line);
            let sealed = seal(&key, REQUEST, number, body);
            if to_agent.write_all(&sealed).await.is_err() || to_agent.flush().await.is_err() {
                break;
            }
        }
        let _ = to_agent.shutdown().await;
    });
    let opening = tokio::spawn(async move {
        let mut from_agent = BufReader::new(from_agent);
        let mut line = Vec::new();
        for number in 0u64.. {
            line.clear();
            let limit = (MAX_LINE + SEAL_LEN + 1) as u64;
            match (&mut from_agent)
                .take(limit)
                .read_until(b'\n', &mut line)
                .await
            {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let Some(body) = line.strip_suffix(b"\n") else {
                break;
            };
            let Some(mut body) = open(&key, ANSWER, number, body) else {
                tracing::warn!("exec_agent.forged_line");
                break;
            };
            body.push(b'\n');
            if answers.write_all(&body).await.is_err() {
                break;
            }
        }
        let _ = answers.shutdown().await;
    });
    let (output, input) = tokio::io::split(ours);
    Channel {
        input: Box::pin(input),
        output: Box::pin(output),
        keep: Box::new(Tasks([sealing.abort_handle(), opening.abort_handle()])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec_agent::{Agent, Script, argv};
    use std::time::Duration;

    /// Starts the real agent on this host listening on `path`: the key it handed out.
    fn listening(path: &std::path::Path) -> Key {
        let argv = argv();
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .arg("--listen")
            .arg(path)
            .output()
            .expect("python3 runs it");
        assert!(out.status.success());
        key_from_hex(&String::from_utf8_lossy(&out.stdout)).expect("a key")
    }

    #[tokio::test]
    async fn a_listening_agent_answers_sealed_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent");
        let key = listening(&path);
        let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
        let agent = Agent::over(channel(stream, key)).await.expect("ready");
        let script = Script {
            script: "echo sealed",
            cwd: "/",
            env: &[],
        };
        let out = agent.run("0", &script, Duration::from_secs(10)).await;
        assert_eq!(out.ok().map(|o| o.stdout).as_deref(), Some("sealed\n"));
        assert!(!path.exists(), "one connection, then the socket is gone");
        agent.end();

        // The bot's try: a request sealed with a key of its own. The agent ends unanswered.
        let key = listening(&path);
        let mut raw = BufReader::new(tokio::net::UnixStream::connect(&path).await.unwrap());
        let mut ready = Vec::new();
        raw.read_until(b'\n', &mut ready).await.unwrap();
        let body = ready.strip_suffix(b"\n").unwrap();
        assert_eq!(
            open(&key, ANSWER, 0, body).as_deref(),
            Some(&b"{\"ready\":1}"[..])
        );
        let forged = seal(
            &[0u8; 32],
            REQUEST,
            0,
            br#"{"id":1,"run":"0","script":"touch /tmp/x"}"#,
        );
        raw.get_mut().write_all(&forged).await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut rest));
        assert_eq!(
            read.await.unwrap().unwrap(),
            0,
            "no answer: the agent ended"
        );

        // An agent that is not the one started (the bot's listener in its place) cannot seal
        // its lines: it never counts as ready.
        let (ours, mut theirs) = tokio::io::duplex(1024);
        theirs.write_all(b"{\"ready\":1}\n").await.unwrap();
        assert!(Agent::over(channel(ours, key)).await.is_err());
    }

    #[test]
    fn a_line_opens_only_with_its_key_direction_and_number() {
        let key = [7u8; 32];
        let sealed = seal(&key, ANSWER, 3, b"{\"id\":1}");
        let line = &sealed[..sealed.len() - 1];
        assert_eq!(
            open(&key, ANSWER, 3, line).as_deref(),
            Some(&b"{\"id\":1}"[..])
        );
        assert_eq!(open(&[8u8; 32], ANSWER, 3, line), None, "another key");
        assert_eq!(open(&key, REQUEST, 3, line), None, "the other direction");
        assert_eq!(
            open(&key, ANSWER, 4, line),
            None,
            "another number (a repeat)"
        );
        let mut changed = line.to_vec();
        *changed.last_mut().unwrap() = b']';
        assert_eq!(open(&key, ANSWER, 3, &changed), None, "a changed body");
        assert_eq!(open(&key, ANSWER, 3, b"short"), None);
        assert_eq!(key_from_hex(&hex::encode(key)), Some(key));
        assert_eq!(key_from_hex("00ff"), None);
    }
}
