//! Box's HTTP client (`BOAT_API_URL`, `Authorization: Bearer BOAT_API_KEY`): lifecycle with
//! `noEnv: true` on every create and resume, an `Idempotency-Key` on create, the delete
//! confirmation header, commands, files and protected host URLs. Vendor errors become
//! [`ProviderError`] here; no message carries a host, a URL or the key.

use std::time::Duration;

use base64::Engine as _;
use rakazo_actors::provider::{ProviderError, ProviderResult};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::wire::{
    CONFIRM_DELETE_HEADER, Command, CommandResult, CreateSandbox, Envelope, ErrorEnvelope,
    FileContent, HostPort, HostUrl, IDEMPOTENCY_HEADER, MAX_COMMAND_SECONDS, Patch, Resume,
    Sandbox, State, codes,
};
use crate::providers::daytona::client::{query, seg};

/// Box's own API.
pub const DEFAULT_API_URL: &str = "https://boat.dev/api/v1";
/// The TTL every create, resume and refresh asks for.
pub const TTL: Duration = Duration::from_secs(2 * 60 * 60);
/// Deadline of every call but commands.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Extra time a command call gets past the command's own deadline.
const COMMAND_SLACK: Duration = Duration::from_secs(15);
/// Between two looks while waiting for a state.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Largest answer read, but for a file's: a command's answer carries what the bot printed.
const MAX_ANSWER: u64 = 64 << 20;

/// A failure as the API answered it.
#[derive(Debug)]
pub struct Refusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// The envelope's code (empty when the body was not an envelope).
    pub code: String,
    /// Its message.
    pub message: String,
}

impl Refusal {
    /// The provider error for a sandbox call: a missing sandbox or an expired snapshot is
    /// gone.
    pub fn into_error(self) -> ProviderError {
        match (self.status, self.code.as_str()) {
            (_, codes::SNAPSHOT_EXPIRED) | (StatusCode::GONE, _) => ProviderError::MachineGone,
            (StatusCode::NOT_FOUND, c) if c != codes::FILE_NOT_FOUND => ProviderError::MachineGone,
            (StatusCode::NOT_FOUND, _) => ProviderError::NotFound("file".into()),
            (_, codes::PATH_NOT_ALLOWED) => {
                ProviderError::PathRejected("outside the paths the computer allows".into())
            }
            (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN, _) => {
                ProviderError::Failed("box refused the API key".into())
            }
            (s, c) => ProviderError::Failed(format!(
                "box: HTTP {} {c}: {}",
                s.as_u16(),
                self.message.chars().take(300).collect::<String>()
            )),
        }
    }
}

fn unreachable(e: &reqwest::Error) -> ProviderError {
    ProviderError::Failed(format!(
        "box unreachable ({})",
        if e.is_timeout() {
            "timeout"
        } else {
            "connection"
        }
    ))
}

/// A client of one Box API.
#[derive(Clone)]
pub struct BoatClient {
    http: reqwest::Client,
    api: String,
    key: String,
}

impl BoatClient {
    /// A client of the API at `api_url` (e.g. `.../api/v1`).
    pub fn new(api_url: &str, key: &str) -> ProviderResult<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| ProviderError::Failed(format!("box client: {e}")))?;
        Ok(Self {
            http,
            api: api_url.trim_end_matches('/').to_string(),
            key: key.to_string(),
        })
    }

    /// One call: the answer's body, or the API's refusal.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> ProviderResult<Result<T, Refusal>> {
        self.call_within(method, path, body, headers, timeout, MAX_ANSWER)
            .await
    }

    /// [`Self::call`], its answer read as it comes and refused past `cap` bytes
    /// (`TooLarge`).
    async fn call_within<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        headers: &[(&str, &str)],
        timeout: Duration,
        cap: u64,
    ) -> ProviderResult<Result<T, Refusal>> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.api))
            .bearer_auth(&self.key)
            .timeout(timeout);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| unreachable(&e))?;
        let status = resp.status();
        let answer = crate::providers::remote::body_within(resp, cap)
            .await
            .map_err(|e| unreachable(&e))?
            .ok_or_else(|| ProviderError::TooLarge(format!("a box answer past {cap} bytes")))?;
        if status.is_success() {
            return serde_json::from_slice::<T>(&answer)
                .map(Ok)
                .map_err(|e| ProviderError::Failed(format!("box answer: {e}")));
        }
        let text = String::from_utf8_lossy(&answer);
        Ok(Err(match serde_json::from_str::<ErrorEnvelope>(&text) {
            Ok(e) => Refusal {
                status,
                code: e.code,
                message: e.message,
            },
            Err(_) => Refusal {
                status,
                code: String::new(),
                message: text.chars().take(200).collect(),
            },
        }))
    }

    async fn sandbox_call(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        headers: &[(&str, &str)],
    ) -> ProviderResult<Sandbox> {
        let env: Envelope = self
            .call(method, path, body, headers, CALL_TIMEOUT)
            .await?
            .map_err(Refusal::into_error)?;
        env.sandbox
            .ok_or_else(|| ProviderError::Failed("box answered without the sandbox".into()))
    }

    /// Whether the API answers this key (`GET /sandboxes?limit=1`).
    pub async fn health(&self) -> ProviderResult<()> {
        self.call::<serde_json::Value>(
            Method::GET,
            "/sandboxes?limit=1",
            None::<&()>,
            &[],
            CALL_TIMEOUT,
        )
        .await?
        .map(|_| ())
        .map_err(Refusal::into_error)
    }

    /// `POST /sandboxes` with `noEnv: true`, a two-hour TTL and `idempotency_key`.
    pub async fn create(
        &self,
        from: Option<&str>,
        idempotency_key: &str,
    ) -> ProviderResult<Sandbox> {
        let body = CreateSandbox {
            r#type: None,
            ttl_seconds: TTL.as_secs(),
            no_env: true,
            from: from.map(str::to_string),
        };
        self.sandbox_call(
            Method::POST,
            "/sandboxes",
            Some(&body),
            &[(IDEMPOTENCY_HEADER, idempotency_key)],
        )
        .await
    }

    /// `GET /sandboxes/{id}`; `MachineGone` on 404.
    pub async fn get(&self, id: &str) -> ProviderResult<Sandbox> {
        self.sandbox_call(
            Method::GET,
            &format!("/sandboxes/{}", seg(id)),
            None::<&()>,
            &[],
        )
        .await
    }

    /// `PATCH /sandboxes/{id}`: the TTL is two hours from now again.
    pub async fn refresh_ttl(&self, id: &str) -> ProviderResult<Sandbox> {
        let body = Patch {
            ttl_seconds: TTL.as_secs(),
        };
        self.sandbox_call(
            Method::PATCH,
            &format!("/sandboxes/{}", seg(id)),
            Some(&body),
            &[],
        )
        .await
    }

    /// `POST /sandboxes/{id}/stop`: it is snapshotted and archived.
    pub async fn stop(&self, id: &str) -> ProviderResult<Sandbox> {
        self.sandbox_call(
            Method::POST,
            &format!("/sandboxes/{}/stop", seg(id)),
            None::<&()>,
            &[],
        )
        .await
    }

    /// `POST /sandboxes/{id}/resume` with `noEnv: true` and a two-hour TTL: the same id runs
    /// again.
    pub async fn resume(&self, id: &str) -> ProviderResult<Sandbox> {
        let body = Resume {
            ttl_seconds: Some(TTL.as_secs()),
            no_env: true,
        };
        self.sandbox_call(
            Method::POST,
            &format!("/sandboxes/{}/resume", seg(id)),
            Some(&body),
            &[],
        )
        .await
    }

    /// `DELETE /sandboxes/{id}` with its confirmation header; a sandbox already gone is fine.
    pub async fn delete(&self, id: &str) -> ProviderResult<()> {
        let ans = self
            .call::<Envelope>(
                Method::DELETE,
                &format!("/sandboxes/{}", seg(id)),
                None::<&()>,
                &[(CONFIRM_DELETE_HEADER, id)],
                CALL_TIMEOUT,
            )
            .await?;
        match ans.map_err(Refusal::into_error) {
            Ok(_) | Err(ProviderError::MachineGone) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Polls until the sandbox is usable; gone states are `MachineGone`, an error or another
    /// settled state is a failure naming it.
    pub async fn wait_usable(&self, id: &str, limit: Duration) -> ProviderResult<Sandbox> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let sb = self.get(id).await?;
            let state = sb.state();
            if state.usable() {
                return Ok(sb);
            }
            if sb.is_gone() {
                return Err(ProviderError::MachineGone);
            }
            if !state.in_transition() || tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::Failed(format!(
                    "box sandbox is {}",
                    state.as_str()
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Polls until an archive finished (`archived`); gone states are `MachineGone`.
    pub async fn wait_archived(&self, id: &str, limit: Duration) -> ProviderResult<Sandbox> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let sb = self.get(id).await?;
            if sb.state() == State::Archived && sb.snapshot_available {
                return Ok(sb);
            }
            if sb.is_gone() {
                return Err(ProviderError::MachineGone);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::Failed(format!(
                    "box sandbox still {}",
                    sb.state
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// `POST /sandboxes/{id}/commands`; the deadline is clamped to the API's 1..600 s.
    pub async fn command(
        &self,
        id: &str,
        command: &str,
        cwd: Option<&str>,
        timeout: Duration,
    ) -> ProviderResult<CommandResult> {
        let secs = (timeout.as_secs_f64().ceil() as u64).clamp(1, MAX_COMMAND_SECONDS);
        let body = Command {
            command: command.to_string(),
            cwd: cwd.map(str::to_string),
            timeout_seconds: secs,
            detached: false,
        };
        self.call(
            Method::POST,
            &format!("/sandboxes/{}/commands", seg(id)),
            Some(&body),
            &[],
            Duration::from_secs(secs) + COMMAND_SLACK,
        )
        .await?
        .map_err(Refusal::into_error)
    }

    /// `GET /sandboxes/{id}/files?path=&encoding=base64`, a file of at most `limit` bytes
    /// (its answer is refused past what such a file takes in base64).
    pub async fn read_file(&self, id: &str, path: &str, limit: u64) -> ProviderResult<Vec<u8>> {
        let q = format!(
            "/sandboxes/{}/files?path={}&encoding=base64",
            seg(id),
            query(path)
        );
        let cap = limit.div_ceil(3) * 4 + 64 * 1024;
        let file: FileContent = self
            .call_within(Method::GET, &q, None::<&()>, &[], CALL_TIMEOUT, cap)
            .await?
            .map_err(Refusal::into_error)?;
        base64::engine::general_purpose::STANDARD
            .decode(file.content)
            .map_err(|_| ProviderError::Failed("box sent a file that is not base64".into()))
    }

    /// `PUT /sandboxes/{id}/files` in base64.
    pub async fn write_file(&self, id: &str, path: &str, data: &[u8]) -> ProviderResult<()> {
        let body = FileContent {
            path: path.to_string(),
            content: base64::engine::general_purpose::STANDARD.encode(data),
            encoding: "base64".into(),
        };
        self.call::<serde_json::Value>(
            Method::PUT,
            &format!("/sandboxes/{}/files", seg(id)),
            Some(&body),
            &[],
            CALL_TIMEOUT,
        )
        .await?
        .map(|_| ())
        .map_err(Refusal::into_error)
    }

    /// `POST /sandboxes/{id}/host` for a protected URL of `port` (its token in `?_token=`).
    pub async fn host(&self, id: &str, port: u16) -> ProviderResult<HostUrl> {
        let url: HostUrl = self
            .call(
                Method::POST,
                &format!("/sandboxes/{}/host", seg(id)),
                Some(&HostPort {
                    port,
                    public: false,
                }),
                &[],
                CALL_TIMEOUT,
            )
            .await?
            .map_err(Refusal::into_error)?;
        if !url.is_protected {
            return Err(ProviderError::Failed(
                "box gave an unprotected host URL".into(),
            ));
        }
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_the_provider_errors_the_actors_act_on() {
        let r = |status: u16, code: &str| Refusal {
            status: StatusCode::from_u16(status).unwrap(),
            code: code.into(),
            message: "m".into(),
        };
        assert_eq!(
            r(404, codes::NOT_FOUND).into_error(),
            ProviderError::MachineGone
        );
        assert_eq!(
            r(410, codes::SNAPSHOT_EXPIRED).into_error(),
            ProviderError::MachineGone
        );
        assert!(matches!(
            r(404, codes::FILE_NOT_FOUND).into_error(),
            ProviderError::NotFound(_)
        ));
        assert!(matches!(
            r(403, codes::PATH_NOT_ALLOWED).into_error(),
            ProviderError::PathRejected(_)
        ));
        assert!(matches!(
            r(409, codes::INVALID_STATE).into_error(),
            ProviderError::Failed(_)
        ));
        let ProviderError::Failed(m) = r(401, codes::UNAUTHORIZED).into_error() else {
            panic!()
        };
        assert!(!m.contains("Bearer"));
    }
}
