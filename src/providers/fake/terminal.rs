//! The fake provider's terminal gateway: a loopback websocket server (`/websockify?token=...`,
//! like the screen gateway) serving an emulated shell in the terminal frame protocol.
//!
//! Each connection gets a line-editing shell whose lines run through the fake machine's
//! command emulator, so the browser terminal can be driven end to end through the sealed
//! capability and the screen proxy without any host shell. Closing a token's route (or the
//! machine going away) closes its connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use rakazo_actors::provider::{ExecRequest, ProviderError, ProviderRef, ScreenRoute};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OnceCell, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

use super::FakeProvider;
use crate::desktop::terminal_frames::{FrameReader, TerminalFrame, VERSION};

/// The prompt of the emulated shell.
const PROMPT: &str = "rakazo@computer:~$ ";
/// Deadline of one emulated command line.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// A live token: the machine it serves and the switch that closes its connections.
struct Route {
    machine: ProviderRef,
    closed: watch::Sender<bool>,
}

/// The loopback gateway shared by every fake machine of one provider.
#[derive(Default)]
pub(super) struct FakeTerminals {
    port: OnceCell<u16>,
    routes: Arc<Mutex<HashMap<String, Route>>>,
}

impl FakeTerminals {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Route>> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh route to an emulated shell on `machine`, starting the gateway on first use.
    pub(super) async fn open(
        &self,
        provider: &FakeProvider,
        machine: &ProviderRef,
    ) -> Result<ScreenRoute, ProviderError> {
        let port = self
            .port
            .get_or_try_init(|| start(provider.clone(), self.routes.clone()))
            .await?;
        let token = format!("{:032x}", rand::random::<u128>());
        let (closed, _) = watch::channel(false);
        self.routes().insert(
            token.clone(),
            Route {
                machine: machine.clone(),
                closed,
            },
        );
        Ok(ScreenRoute {
            upstream: format!("http://127.0.0.1:{port}"),
            token,
        })
    }

    /// Closes one route and its connections.
    pub(super) fn close(&self, token: &str) {
        if let Some(route) = self.routes().remove(token) {
            let _ = route.closed.send(true);
        }
    }

    /// Closes every route of `machine`.
    pub(super) fn close_machine(&self, machine: &ProviderRef) {
        self.routes().retain(|_, r| {
            let keep = &r.machine != machine;
            if !keep {
                let _ = r.closed.send(true);
            }
            keep
        });
    }
}

async fn start(
    provider: FakeProvider,
    routes: Arc<Mutex<HashMap<String, Route>>>,
) -> Result<u16, ProviderError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| ProviderError::Failed(format!("terminal gateway: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| ProviderError::Failed(format!("terminal gateway: {e}")))?
        .port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, provider.clone(), routes.clone()));
        }
    });
    Ok(port)
}

/// The `token` query parameter of a `/websockify` request.
fn token_of(request: &Request) -> Option<String> {
    if request.uri().path() != "/websockify" {
        return None;
    }
    request
        .uri()
        .query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
        .map(str::to_owned)
}

// The handshake callback's error type is tungstenite's, not ours.
#[allow(clippy::result_large_err)]
async fn serve(
    stream: TcpStream,
    provider: FakeProvider,
    routes: Arc<Mutex<HashMap<String, Route>>>,
) {
    let mut token = None;
    let accepted = tokio_tungstenite::accept_hdr_async(stream, |req: &Request, resp: Response| {
        token = token_of(req);
        Ok(resp)
    })
    .await;
    let Ok(mut ws) = accepted else { return };
    let route = token.and_then(|t| {
        let routes = routes.lock().unwrap_or_else(|p| p.into_inner());
        routes
            .get(&t)
            .map(|r| (r.machine.clone(), r.closed.subscribe()))
    });
    let Some((machine, mut closed)) = route else {
        // Like websockify with an unknown token: no shell, just a close.
        let _ = ws.close(None).await;
        return;
    };
    let mut shell = LineShell::default();
    let mut reader = FrameReader::default();
    let mut out = TerminalFrame::Hello(VERSION).encode();
    out.extend(TerminalFrame::Data(PROMPT.into()).encode());
    if ws.send(Message::binary(out)).await.is_err() {
        return;
    }
    loop {
        let message = tokio::select! {
            m = ws.next() => m,
            _ = closed.changed() => break,
        };
        let bytes = match message {
            Some(Ok(Message::Binary(b))) => b.to_vec(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            _ => break,
        };
        reader.push(&bytes);
        loop {
            let frame = match reader.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => {
                    let _ = ws.close(None).await;
                    return;
                }
            };
            let TerminalFrame::Data(input) = frame else {
                continue;
            };
            let (echo, lines, eof) = shell.feed(&input);
            let mut reply = echo;
            for line in lines {
                match run_line(&provider, &machine, &line).await {
                    Ok(output) => {
                        reply.extend(output);
                        reply.extend_from_slice(PROMPT.as_bytes());
                    }
                    Err(status) => return finish(ws, reply, status).await,
                }
            }
            if eof {
                return finish(ws, reply, 0).await;
            }
            if !reply.is_empty()
                && ws
                    .send(Message::binary(TerminalFrame::Data(reply).encode()))
                    .await
                    .is_err()
            {
                return;
            }
        }
    }
    let _ = ws.close(None).await;
}

/// Sends the last output and the exit frame, then closes.
async fn finish(
    mut ws: tokio_tungstenite::WebSocketStream<TcpStream>,
    output: Vec<u8>,
    status: i32,
) {
    let mut bytes = TerminalFrame::Data(output).encode();
    bytes.extend(TerminalFrame::Exit(status).encode());
    let _ = ws.send(Message::binary(bytes)).await;
    let _ = ws.close(None).await;
}

/// Runs one line on the machine: its output with terminal line ends, or the shell's exit status
/// when the line ends the shell (`exit`, a lost machine).
async fn run_line(
    provider: &FakeProvider,
    machine: &ProviderRef,
    line: &str,
) -> Result<Vec<u8>, i32> {
    if line.trim().is_empty() {
        return Ok(Vec::new());
    }
    let trimmed = line.trim();
    if trimmed == "exit" {
        return Err(0);
    }
    if let Some(code) = trimmed
        .strip_prefix("exit ")
        .and_then(|c| c.trim().parse().ok())
    {
        return Err(code);
    }
    let request = ExecRequest {
        command: line.to_owned(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: LINE_TIMEOUT,
    };
    use rakazo_actors::provider::SandboxProvider as _;
    match provider.exec(machine, &request).await {
        Ok(out) => {
            let text = format!("{}{}", out.stdout, out.stderr);
            Ok(text.replace('\n', "\r\n").into_bytes())
        }
        Err(_) => Err(-1),
    }
}

/// A minimal line discipline: echo, backspace, Ctrl-C, Ctrl-D on an empty line, and escape
/// sequences (arrow keys) ignored.
#[derive(Default)]
struct LineShell {
    line: String,
    escape: bool,
}

impl LineShell {
    /// Feeds keystrokes: what to echo, the completed lines, and whether the shell got EOF.
    fn feed(&mut self, input: &[u8]) -> (Vec<u8>, Vec<String>, bool) {
        let mut echo = Vec::new();
        let mut lines = Vec::new();
        for ch in String::from_utf8_lossy(input).chars() {
            if self.escape {
                self.escape = !(ch.is_ascii_alphabetic() || ch == '~');
                continue;
            }
            match ch {
                '\x1b' => self.escape = true,
                '\r' | '\n' => {
                    echo.extend_from_slice(b"\r\n");
                    lines.push(std::mem::take(&mut self.line));
                }
                '\x7f' | '\x08' if !self.line.is_empty() => {
                    self.line.pop();
                    echo.extend_from_slice(b"\x08 \x08");
                }
                '\x03' => {
                    self.line.clear();
                    echo.extend_from_slice(b"^C\r\n");
                    echo.extend_from_slice(PROMPT.as_bytes());
                }
                '\x04' if self.line.is_empty() => return (echo, lines, true),
                c if !c.is_control() => {
                    self.line.push(c);
                    let mut buf = [0; 4];
                    echo.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                _ => {}
            }
        }
        (echo, lines, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_discipline() {
        let mut s = LineShell::default();
        let (echo, lines, eof) = s.feed(b"ech\x7fho hi\x1b[A\r");
        assert_eq!(lines, vec!["echo hi".to_owned()]);
        assert!(!eof);
        assert!(echo.starts_with(b"ech\x08 \x08ho hi"));
        let (_, lines, eof) = s.feed(b"abc\x03\x04");
        assert!(lines.is_empty() && eof);
    }
}
