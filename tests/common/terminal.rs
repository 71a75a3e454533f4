//! A terminal client for tests: the websocket of a terminal URL through the screen proxy,
//! speaking the terminal frame protocol.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rakazo::desktop::terminal_frames::{FrameReader, TerminalFrame};
use tokio_tungstenite::tungstenite::{self, Message};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How a terminal session ended, as the client saw it.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The shell exited with this status.
    Exit(i32),
    /// The socket closed with this reason.
    Closed(String),
}

/// One shell through the proxy.
pub struct TerminalClient {
    ws: Socket,
    reader: FrameReader,
    /// Everything the shell printed so far.
    pub output: String,
}

impl TerminalClient {
    /// Connects to `url` (a path from `computer.terminalUrl`) on the server at `base`.
    pub async fn connect(base: &str, url: &str) -> Result<TerminalClient, tungstenite::Error> {
        let (ws, _) =
            tokio_tungstenite::connect_async(format!("{}{url}", base.replace("http://", "ws://")))
                .await?;
        Ok(TerminalClient {
            ws,
            reader: FrameReader::default(),
            output: String::new(),
        })
    }

    /// Sends keystrokes.
    pub async fn send(&mut self, keys: &str) {
        self.ws
            .send(Message::binary(
                TerminalFrame::Data(keys.as_bytes().to_vec()).encode(),
            ))
            .await
            .expect("send keys");
    }

    /// Sends a window size.
    pub async fn resize(&mut self, cols: u16, rows: u16) {
        self.ws
            .send(Message::binary(
                TerminalFrame::Resize { cols, rows }.encode(),
            ))
            .await
            .expect("send resize");
    }

    /// Reads frames until the output contains `needle`; panics after `timeout`.
    pub async fn expect(&mut self, needle: &str, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.output.contains(needle) {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(Ok(())) => {}
                Ok(Err(end)) => panic!(
                    "terminal ended ({end:?}) before {needle:?}: {}",
                    self.output
                ),
                Err(_) => panic!("no {needle:?} in terminal output: {}", self.output),
            }
        }
    }

    /// Reads until the session ends.
    pub async fn ended(&mut self, timeout: Duration) -> Ended {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(Ok(())) => {}
                Ok(Err(end)) => return end,
                Err(_) => panic!("terminal still open: {}", self.output),
            }
        }
    }

    /// Reads one websocket message into the output; `Err` when the session ended.
    async fn next(&mut self) -> Result<(), Ended> {
        match self.ws.next().await {
            Some(Ok(Message::Binary(bytes))) => {
                self.reader.push(&bytes);
                while let Some(frame) = self.reader.next_frame().expect("well-formed frames") {
                    match frame {
                        TerminalFrame::Data(d) => {
                            self.output.push_str(&String::from_utf8_lossy(&d))
                        }
                        TerminalFrame::Exit(status) => return Err(Ended::Exit(status)),
                        TerminalFrame::Hello(v) => assert_eq!(v, 1, "protocol version"),
                        TerminalFrame::Resize { .. } => panic!("a server never sends resize"),
                    }
                }
                Ok(())
            }
            Some(Ok(Message::Close(frame))) => Err(Ended::Closed(
                frame.map(|f| f.reason.to_string()).unwrap_or_default(),
            )),
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(Ended::Closed(format!("error: {e}"))),
            None => Err(Ended::Closed(String::new())),
        }
    }
}
