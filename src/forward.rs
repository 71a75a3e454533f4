//! Machine calls and screen operations for a computer another process owns: the [`Forward`]
//! adapter posts them to that process's `POST /internal/computer` with the internal credential,
//! and [`serve`] answers them there through this process's own actors.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use async_trait::async_trait;
use rakazo_actors::computer::{Call, SaveWorkspace, Suspend};
use rakazo_actors::computers::{Computers, EndReason};
use rakazo_actors::owners::{Forward, Owner, Owners, Remote, RemoteOutput};
use rakazo_actors::screen::{Evict, Open, ScreenOp, Teardown};
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::config::Secret;

/// Largest forwarded request (a file write, as JSON).
const MAX_BODY: usize = 256 * 1024 * 1024;
/// Added to the command timeout for a forwarded call's whole round trip.
const GRACE: Duration = Duration::from_secs(30);

/// One forwarded request.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    computer_id: String,
    remote: Remote,
}

/// Its answer: the output, or the owner's error.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Answer {
    Ok(RemoteOutput),
    Err { code: ErrorCode, message: String },
}

/// The HTTP adapter of [`Forward`].
pub struct HttpForward {
    http: reqwest::Client,
    token: Secret,
}

impl HttpForward {
    /// An adapter sending `token` (the deployment's internal credential).
    pub fn new(token: Secret, command_timeout: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(command_timeout + GRACE)
            .build()
            .expect("http client");
        Self { http, token }
    }
}

fn unavailable(why: &str) -> DomainError {
    DomainError::new(ErrorCode::ComputerUnavailable, why)
}

#[async_trait]
impl Forward for HttpForward {
    async fn send(
        &self,
        address: &str,
        computer_id: &str,
        remote: Remote,
    ) -> DomainResult<RemoteOutput> {
        let body = Request {
            computer_id: computer_id.to_owned(),
            remote,
        };
        let resp = self
            .http
            .post(format!("{address}/internal/computer"))
            .bearer_auth(&self.token.0)
            .json(&body)
            .send()
            .await
            .map_err(|_| unavailable("the process holding the computer did not answer"))?;
        match resp.json::<Answer>().await {
            Ok(Answer::Ok(out)) => Ok(out),
            Ok(Answer::Err { code, message }) => Err(DomainError::new(code, message)),
            Err(_) => Err(unavailable(
                "the process holding the computer answered unreadably",
            )),
        }
    }
}

/// `POST /internal/computer`: a call forwarded by another process, run by this process's
/// actor of the computer. Refused when this process does not own the computer either (no
/// second hop).
pub async fn serve(app: web::Data<App>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    if !crate::api::internal_caller(&app, &req) {
        tracing::warn!(event = "computer.forward_unauthorized");
        return HttpResponse::Unauthorized().finish();
    }
    let Ok(body) = crate::api::read_body(payload, MAX_BODY).await else {
        return HttpResponse::PayloadTooLarge().finish();
    };
    let Ok(request) = serde_json::from_slice::<Request>(&body) else {
        return HttpResponse::BadRequest().finish();
    };
    let answer = match run(&app, request).await {
        Ok(out) => Answer::Ok(out),
        Err(e) => Answer::Err {
            code: e.code,
            message: e.message,
        },
    };
    HttpResponse::Ok().json(answer)
}

async fn run(app: &App, request: Request) -> DomainResult<RemoteOutput> {
    let owners = Owners::new(app.db.clone());
    if let Owner::Elsewhere { .. } = owners.claim(&request.computer_id).await? {
        return Err(unavailable("the computer's owner is changing; try again"));
    }
    let row = Computers::new(app.db.clone())
        .get(&request.computer_id)
        .await?;
    let handle = app.registry.computer(&row.id, &row.space_id);
    match request.remote {
        Remote::Call(op) => Ok(RemoteOutput::Call(handle.computer.send(Call(op)).await??)),
        Remote::Save(reason) => Ok(RemoteOutput::Saved(
            handle.computer.send(SaveWorkspace(reason)).await??,
        )),
        Remote::Stop => {
            handle.computer.send(Suspend(EndReason::Stopped)).await??;
            Ok(RemoteOutput::Stopped)
        }
        Remote::Screen { bot_id, op } => {
            let screen = app.registry.screen(&handle, &bot_id);
            Ok(RemoteOutput::Screen(match op {
                ScreenOp::Open => Some(screen.send(Open).await??),
                ScreenOp::Teardown => {
                    screen.send(Teardown).await??;
                    None
                }
                ScreenOp::Evict => {
                    screen.send(Evict).await??;
                    None
                }
            }))
        }
    }
}
