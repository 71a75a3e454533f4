//! A program on an E2B machine attached to this host: `Start` with `stdin: true` and no
//! deadline, held open for its standard output; what this host writes goes to its standard
//! input by `SendInput`, in order. Dropping the channel kills it.

use std::io;

use base64::Engine as _;
use bytes::Bytes;
use rakazo_actors::provider::{ProviderError, ProviderResult};
use serde_json::json;
use tokio::io::AsyncReadExt as _;
use tokio_util::io::StreamReader;

use super::connect::{Decoder, Frame};
use super::{E2b, Session, transport};
use crate::exec_agent::Channel;
use crate::providers::remote::RemoteCommand;

/// Bytes of standard input per `SendInput`.
const INPUT_CHUNK: usize = 64 << 10;
/// Decoded chunks of standard output waiting for the reader.
const OUTPUT_QUEUE: usize = 64;

/// Starts `command` attached (see the module's doc).
pub(super) async fn attach(
    e2b: &E2b,
    s: &Session,
    command: &RemoteCommand,
) -> ProviderResult<Channel> {
    let mut resp = e2b
        .start_request(s, command, true)
        .send()
        .await
        .map_err(|e| transport("envd", &e))?;
    match resp.status().as_u16() {
        200 => {}
        502 => return Err(ProviderError::MachineGone),
        other => {
            return Err(ProviderError::Failed(format!(
                "envd answered {other} to an attached start"
            )));
        }
    }
    let mut decoder = Decoder::default();
    let pid = loop {
        match decoder.next_frame().map_err(ProviderError::Failed)? {
            Some(Frame::Message(m)) => match m["event"]["start"]["pid"].as_u64() {
                Some(pid) => break pid,
                None => {
                    return Err(ProviderError::Failed(
                        "envd's stream did not begin with the process start".into(),
                    ));
                }
            },
            Some(Frame::End(end)) => {
                return Err(match end["error"]["code"].as_str() {
                    Some("unavailable") => ProviderError::MachineGone,
                    _ => ProviderError::Failed("the attached program did not start".into()),
                });
            }
            None => match resp
                .chunk()
                .await
                .map_err(|e| transport("envd stream", &e))?
            {
                Some(bytes) => decoder.push(&bytes),
                None => return Err(ProviderError::Failed("envd's stream ended early".into())),
            },
        }
    };
    let (out_tx, out_rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(OUTPUT_QUEUE);
    let reader = tokio::spawn(read_output(resp, decoder, out_tx));
    let (ours, mut theirs) = tokio::io::duplex(INPUT_CHUNK);
    let (input_e2b, input_session) = (e2b.clone(), s.clone());
    let writer = tokio::spawn(async move {
        let mut buf = vec![0u8; INPUT_CHUNK];
        // One `SendInput` at a time, so the bytes arrive in the order written; a refused one
        // ends the input (the agent's next write then fails).
        while let Ok(n) = theirs.read(&mut buf).await {
            if n == 0
                || send_input(&input_e2b, &input_session, pid, &buf[..n])
                    .await
                    .is_err()
            {
                break;
            }
        }
    });
    let output = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    Ok(Channel {
        input: Box::pin(ours),
        output: Box::pin(StreamReader::new(output)),
        keep: Box::new(Attached {
            tasks: [reader.abort_handle(), writer.abort_handle()],
            kill: Some((e2b.clone(), s.clone(), pid)),
        }),
    })
}

/// Feeds the standard output of the stream to `out` until it ends.
async fn read_output(
    mut resp: reqwest::Response,
    mut decoder: Decoder,
    out: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
) {
    let b64 = base64::engine::general_purpose::STANDARD;
    loop {
        loop {
            match decoder.next_frame() {
                Ok(Some(Frame::Message(m))) => {
                    let data = &m["event"]["data"];
                    if let Some(text) = data["stdout"].as_str() {
                        let Ok(bytes) = b64.decode(text) else {
                            let _ = out.send(Err(io::Error::other("unreadable output"))).await;
                            return;
                        };
                        if out.send(Ok(Bytes::from(bytes))).await.is_err() {
                            return;
                        }
                    } else if let Some(text) = data["stderr"].as_str() {
                        tracing::debug!(bytes = text.len(), "e2b.attached.stderr");
                    }
                }
                // The program ended (`end`, then the end of the stream): its output ends.
                Ok(Some(Frame::End(_))) => return,
                Ok(None) => break,
                Err(e) => {
                    let _ = out.send(Err(io::Error::other(e))).await;
                    return;
                }
            }
        }
        match resp.chunk().await {
            Ok(Some(bytes)) => decoder.push(&bytes),
            Ok(None) => return,
            Err(e) => {
                let _ = out.send(Err(io::Error::other(e))).await;
                return;
            }
        }
    }
}

/// `SendInput` of `data` to process `pid`.
async fn send_input(e2b: &E2b, s: &Session, pid: u64, data: &[u8]) -> ProviderResult<()> {
    let stdin = base64::engine::general_purpose::STANDARD.encode(data);
    let resp = e2b
        .envd(s, reqwest::Method::POST, "/process.Process/SendInput")
        .header("Content-Type", "application/json")
        .header("Connect-Protocol-Version", "1")
        .timeout(std::time::Duration::from_secs(30))
        .body(json!({"process": {"pid": pid}, "input": {"stdin": stdin}}).to_string())
        .send()
        .await
        .map_err(|e| transport("envd", &e))?;
    match resp.status().as_u16() {
        200 => Ok(()),
        502 => Err(ProviderError::MachineGone),
        other => Err(ProviderError::Failed(format!(
            "envd answered {other} to input"
        ))),
    }
}

/// What an attached program's channel keeps: its stream's tasks, and its pid to kill.
struct Attached {
    tasks: [tokio::task::AbortHandle; 2],
    kill: Option<(E2b, Session, u64)>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let (Some((e2b, session, pid)), Ok(runtime)) =
            (self.kill.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(async move {
            if let Err(e) = e2b.kill_process(&session, pid).await {
                tracing::debug!(error = %e, "e2b.attached.kill_failed");
            }
        });
    }
}
