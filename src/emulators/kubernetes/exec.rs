//! `pods/exec` over a WebSocket (`v5.channel.k8s.io`, and `v4` for older clients): a Docker
//! exec in the pod's container, its stdin from channel 0 (half-closed by `[255, 0]`), its
//! output on channels 1 and 2, and its `metav1.Status` last on channel 3.

use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::documents::{exec_status, query_pairs, status};
use super::pods::Pods;

/// The subprotocols this server speaks, preferred first.
pub const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Largest WebSocket frame accepted from a client.
const MAX_FRAME: usize = 16 << 20;

/// What the client asked for in the query string.
struct Options {
    command: Vec<String>,
    container: Option<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

fn options(query: &str) -> Options {
    let mut o = Options {
        command: Vec::new(),
        container: None,
        stdin: false,
        stdout: false,
        stderr: false,
        tty: false,
    };
    for (k, v) in query_pairs(query) {
        let on = v == "true" || v == "1";
        match k.as_str() {
            "command" => o.command.push(v),
            "container" => o.container = Some(v),
            "stdin" => o.stdin = on,
            "stdout" => o.stdout = on,
            "stderr" => o.stderr = on,
            "tty" => o.tty = on,
            _ => {}
        }
    }
    o
}

fn bad(message: &str) -> HttpResponse {
    HttpResponse::BadRequest().json(status(400, "BadRequest", message))
}

/// Upgrades the request and runs the command.
pub async fn exec(
    req: HttpRequest,
    body: web::Payload,
    pods: web::Data<Arc<Pods>>,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (ns, name) = path.into_inner();
    let o = options(req.query_string());
    if o.command.is_empty() {
        return bad("you must specify at least 1 command");
    }
    if !(o.stdin || o.stdout || o.stderr) {
        return bad("you must specify at least one of stdin, stdout, stderr");
    }
    let container = match pods.container(&ns, &name, o.container.as_deref()) {
        Ok(c) => c,
        Err((code, body)) => {
            return HttpResponse::build(actix_web::http::StatusCode::from_u16(code).unwrap())
                .json(body);
        }
    };
    let offered = req
        .headers()
        .get_all("sec-websocket-protocol")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(str::trim))
        .any(|p| PROTOCOLS.contains(&p));
    if !offered {
        return bad(
            "exec needs a WebSocket upgrade offering v5.channel.k8s.io or v4.channel.k8s.io (SPDY is not served)",
        );
    }
    let (response, session, stream) = match actix_ws::handle_with_protocols(&req, body, &PROTOCOLS)
    {
        Ok(parts) => parts,
        Err(e) => return bad(&format!("upgrade: {e}")),
    };
    let v5 = response
        .headers()
        .get("sec-websocket-protocol")
        .is_some_and(|p| p.as_bytes() == PROTOCOLS[0].as_bytes());
    let docker = pods.docker().clone();
    actix_web::rt::spawn(async move {
        let stream = stream.max_frame_size(MAX_FRAME);
        if let Err(e) = bridge(docker, container, o, session, stream, v5).await {
            tracing::debug!(error = %e, "kubernetes_emulator.exec.ended");
        }
    });
    response
}

async fn bridge(
    docker: bollard::Docker,
    container: String,
    o: Options,
    mut session: actix_ws::Session,
    mut stream: actix_ws::MessageStream,
    v5: bool,
) -> Result<(), String> {
    let exec = docker
        .create_exec(
            &container,
            CreateExecOptions {
                cmd: Some(o.command.clone()),
                attach_stdin: Some(o.stdin),
                attach_stdout: Some(o.stdout),
                attach_stderr: Some(o.stderr),
                tty: Some(o.tty),
                ..Default::default()
            },
        )
        .await;
    let exec = match exec {
        Ok(e) => e,
        Err(e) => {
            let msg = status(500, "InternalError", &format!("exec: {e}"));
            let _ = send(&mut session, 3, msg.to_string().as_bytes()).await;
            let _ = session.close(Some(normal())).await;
            return Err(e.to_string());
        }
    };
    let started = docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                tty: o.tty,
                ..Default::default()
            }),
        )
        .await
        .map_err(|e| e.to_string())?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        return Err("exec did not attach".into());
    };
    // Client to process: stdin until `[255, 0]` (v5) or the socket closes.
    let stdin_wanted = o.stdin;
    let pump_in = async move {
        let mut open = stdin_wanted;
        while let Some(msg) = stream.next().await {
            let Ok(msg) = msg else { break };
            match msg {
                actix_ws::Message::Binary(data) if !data.is_empty() => match data[0] {
                    0 if open => open = input.write_all(&data[1..]).await.is_ok(),
                    255 if v5 && data.get(1) == Some(&0) && open => {
                        let _ = input.shutdown().await;
                        open = false;
                    }
                    _ => {}
                },
                actix_ws::Message::Close(_) => break,
                _ => {}
            }
        }
        if open {
            let _ = input.shutdown().await;
        }
    };
    // Process to client: stdout and stderr, then the status.
    let pump_out = async {
        while let Some(chunk) = output.next().await {
            let (channel, data) = match chunk {
                Ok(bollard::container::LogOutput::StdOut { message })
                | Ok(bollard::container::LogOutput::Console { message }) => (1u8, message),
                Ok(bollard::container::LogOutput::StdErr { message }) => (2u8, message),
                Ok(_) => continue,
                Err(_) => break,
            };
            if send(&mut session, channel, &data).await.is_err() {
                return Err("client gone".to_owned());
            }
        }
        let code = docker
            .inspect_exec(&exec.id)
            .await
            .ok()
            .and_then(|i| i.exit_code)
            .unwrap_or(-1);
        let body = exec_status(code).to_string();
        send(&mut session, 3, body.as_bytes())
            .await
            .map_err(|_| "client gone".to_owned())?;
        let _ = session.clone().close(Some(normal())).await;
        Ok(())
    };
    tokio::pin!(pump_in);
    tokio::select! {
        r = pump_out => r,
        () = &mut pump_in => {
            // The client went away; the output side finishes on its own or is dropped.
            Ok(())
        }
    }
}

async fn send(
    session: &mut actix_ws::Session,
    channel: u8,
    data: &[u8],
) -> Result<(), actix_ws::Closed> {
    let mut frame = Vec::with_capacity(data.len() + 1);
    frame.push(channel);
    frame.extend_from_slice(data);
    session.binary(Bytes::from(frame)).await
}

/// A normal closure: clients read it as the end of every stream (a close without a code is
/// an error to kubectl).
fn normal() -> actix_ws::CloseReason {
    actix_ws::CloseReason {
        code: actix_ws::CloseCode::Normal,
        description: None,
    }
}
