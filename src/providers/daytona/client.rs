//! Daytona's HTTP client: the sandbox API (`DAYTONA_API_URL`, `Authorization: Bearer
//! DAYTONA_API_KEY`) and each sandbox's toolbox at `{toolboxProxyUrl}/{id}`. Vendor errors
//! become [`ProviderError`] here; no message carries a host, a URL or the key.

use std::time::Duration;

use rakazo_actors::provider::{ProviderError, ProviderResult};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::multipart::{self, Part};
use super::wire::{
    BulkDownload, CreateSandbox, ErrorBody, ExecuteRequest, ExecuteResponse, FileInfo, PreviewUrl,
    Sandbox, State,
};
use crate::providers::remote::json_within;

/// Daytona's own API.
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";
/// Deadline of every API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Extra time an execute call gets past the command's own deadline.
const EXEC_SLACK: Duration = Duration::from_secs(15);
/// Between two looks while waiting for a state.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Largest file a download returns.
const MAX_DOWNLOAD: u64 = 256 << 20;
/// The most any other answer may hold (a command's output comes in one).
const MAX_ANSWER: u64 = 64 << 20;
/// The most of a refusal's body that is read (its message is kept).
const MAX_REFUSAL: u64 = 64 << 10;

/// What a toolbox command came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Executed {
    /// It exited: status and its output (stdout and stderr together).
    Exited { exit_code: i32, output: String },
    /// The daemon killed it at its deadline (HTTP 408).
    TimedOut,
}

/// A client of one Daytona API.
#[derive(Clone)]
pub struct DaytonaClient {
    http: reqwest::Client,
    api: String,
    key: String,
}

/// A failure as the API or the toolbox answered it.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    message: String,
}

fn unreachable(e: &reqwest::Error) -> ProviderError {
    // reqwest's text names the URL (a host): keep only its kind.
    ProviderError::Failed(format!(
        "daytona unreachable ({})",
        if e.is_timeout() {
            "timeout"
        } else {
            "connection"
        }
    ))
}

impl DaytonaClient {
    /// A client of the API at `api_url` (with its path prefix, e.g. `.../api`).
    pub fn new(api_url: &str, key: &str) -> ProviderResult<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| ProviderError::Failed(format!("daytona client: {e}")))?;
        Ok(Self {
            http,
            api: api_url.trim_end_matches('/').to_string(),
            key: key.to_string(),
        })
    }

    fn request(&self, method: Method, url: String, timeout: Duration) -> reqwest::RequestBuilder {
        self.http
            .request(method, url)
            .bearer_auth(&self.key)
            .header("X-Daytona-Source", "rakazo")
            .timeout(timeout)
    }

    async fn answer(resp: reqwest::Response) -> Result<reqwest::Response, Answer> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = crate::providers::remote::body_within(resp, MAX_REFUSAL).await;
        let text = String::from_utf8_lossy(&body.ok().flatten().unwrap_or_default()).into_owned();
        let message = serde_json::from_str::<ErrorBody>(&text)
            .map(|b| b.message)
            .unwrap_or_else(|_| text.chars().take(200).collect());
        Err(Answer { status, message })
    }

    async fn api<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> ProviderResult<Result<T, Answer>> {
        let mut req = self.request(method, format!("{}{path}", self.api), CALL_TIMEOUT);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| unreachable(&e))?;
        match Self::answer(resp).await {
            Ok(resp) => json_within(resp, MAX_ANSWER, "daytona answer")
                .await
                .map(Ok),
            Err(a) => Ok(Err(a)),
        }
    }

    /// The sandbox call's answer: a 404 is [`ProviderError::MachineGone`].
    fn sandbox<T>(answer: Result<T, Answer>) -> ProviderResult<T> {
        answer.map_err(|a| match a.status {
            StatusCode::NOT_FOUND => ProviderError::MachineGone,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                ProviderError::Failed("daytona refused the API key".into())
            }
            s => ProviderError::Failed(format!("daytona: HTTP {}: {}", s.as_u16(), a.message)),
        })
    }

    /// Whether the API answers this key (`GET /sandbox?limit=1`).
    pub async fn health(&self) -> ProviderResult<()> {
        let ans = self
            .api::<serde_json::Value>(Method::GET, "/sandbox?limit=1", None::<&()>)
            .await?;
        Self::sandbox(ans).map(|_| ())
    }

    /// `POST /sandbox`.
    pub async fn create(&self, body: &CreateSandbox) -> ProviderResult<Sandbox> {
        Self::sandbox(self.api(Method::POST, "/sandbox", Some(body)).await?)
    }

    /// `GET /sandbox/{id}`; `MachineGone` on 404.
    pub async fn get(&self, id: &str) -> ProviderResult<Sandbox> {
        Self::sandbox(
            self.api(Method::GET, &format!("/sandbox/{}", seg(id)), None::<&()>)
                .await?,
        )
    }

    async fn lifecycle(&self, id: &str, what: &str) -> ProviderResult<Sandbox> {
        Self::sandbox(
            self.api(
                Method::POST,
                &format!("/sandbox/{}/{what}", seg(id)),
                None::<&()>,
            )
            .await?,
        )
    }

    /// `POST /sandbox/{id}/start`.
    pub async fn start(&self, id: &str) -> ProviderResult<Sandbox> {
        self.lifecycle(id, "start").await
    }

    /// `POST /sandbox/{id}/stop`.
    pub async fn stop(&self, id: &str) -> ProviderResult<Sandbox> {
        self.lifecycle(id, "stop").await
    }

    /// `POST /sandbox/{id}/archive` (a stopped sandbox only).
    pub async fn archive(&self, id: &str) -> ProviderResult<Sandbox> {
        self.lifecycle(id, "archive").await
    }

    /// `POST /sandbox/{id}/autostop/{minutes}`.
    pub async fn set_autostop(&self, id: &str, minutes: u64) -> ProviderResult<Sandbox> {
        self.lifecycle(id, &format!("autostop/{minutes}")).await
    }

    /// `DELETE /sandbox/{id}`; a sandbox already gone is fine.
    pub async fn delete(&self, id: &str) -> ProviderResult<()> {
        let ans = self
            .api::<serde_json::Value>(
                Method::DELETE,
                &format!("/sandbox/{}", seg(id)),
                None::<&()>,
            )
            .await?;
        match Self::sandbox(ans) {
            Ok(_) | Err(ProviderError::MachineGone) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `GET /sandbox/{id}/ports/{port}/preview-url`.
    pub async fn preview_url(&self, id: &str, port: u16) -> ProviderResult<PreviewUrl> {
        Self::sandbox(
            self.api(
                Method::GET,
                &format!("/sandbox/{}/ports/{port}/preview-url", seg(id)),
                None::<&()>,
            )
            .await?,
        )
    }

    /// Polls until the sandbox is in one of `want`; a state the API cannot recover from is
    /// `MachineGone`, any other settled state is a failure naming it.
    pub async fn wait_for(
        &self,
        id: &str,
        want: &[State],
        limit: Duration,
    ) -> ProviderResult<Sandbox> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let sb = self.get(id).await?;
            let state = sb.state();
            if want.contains(&state) {
                return Ok(sb);
            }
            if sb.is_gone() {
                return Err(ProviderError::MachineGone);
            }
            if !state.in_transition() && state != State::Unknown {
                return Err(ProviderError::Failed(format!(
                    "daytona sandbox is {} (waiting for {})",
                    state.as_str(),
                    want.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(" or ")
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::Failed(format!(
                    "daytona sandbox still {} after {}s",
                    state.as_str(),
                    limit.as_secs()
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    fn toolbox(&self, sb: &Sandbox, path: &str) -> ProviderResult<String> {
        if sb.toolbox_proxy_url.is_empty() {
            return Err(ProviderError::Failed(
                "daytona sandbox has no toolbox URL".into(),
            ));
        }
        Ok(format!(
            "{}/{}{path}",
            sb.toolbox_proxy_url.trim_end_matches('/'),
            seg(&sb.id)
        ))
    }

    /// A toolbox answer: 404 is `NotFound` (of `what`), 409 a sandbox that is not started
    /// (its state decides whether it is gone), 401/403 the key.
    fn toolbox_error(a: Answer, what: &str) -> ProviderError {
        match a.status {
            StatusCode::NOT_FOUND => ProviderError::NotFound(what.chars().take(200).collect()),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                ProviderError::Failed("daytona refused the API key".into())
            }
            s => ProviderError::Failed(format!(
                "daytona toolbox: HTTP {}: {}",
                s.as_u16(),
                a.message.chars().take(300).collect::<String>()
            )),
        }
    }

    /// `POST /process/execute`: runs `command` (a shell command line); past `timeout` the
    /// daemon kills it and answers 408.
    pub async fn execute(
        &self,
        sb: &Sandbox,
        command: &str,
        cwd: Option<&str>,
        timeout: Duration,
    ) -> ProviderResult<Executed> {
        let secs = timeout.as_secs_f64().ceil().max(1.0) as u64;
        let body = ExecuteRequest {
            command: command.to_string(),
            cwd: cwd.map(str::to_string),
            envs: None,
            timeout: Some(secs),
        };
        let resp = self
            .request(
                Method::POST,
                self.toolbox(sb, "/process/execute")?,
                Duration::from_secs(secs) + EXEC_SLACK,
            )
            .json(&body)
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        match Self::answer(resp).await {
            Ok(resp) => {
                let out: ExecuteResponse =
                    json_within(resp, MAX_ANSWER, "daytona toolbox answer").await?;
                Ok(Executed::Exited {
                    exit_code: out.exit_code.unwrap_or(0),
                    output: out.result,
                })
            }
            Err(a) if a.status == StatusCode::REQUEST_TIMEOUT => Ok(Executed::TimedOut),
            Err(a) => Err(Self::toolbox_error(a, "command")),
        }
    }

    /// `POST /files/bulk-upload` of one file.
    pub async fn upload(&self, sb: &Sandbox, path: &str, data: Vec<u8>) -> ProviderResult<()> {
        let b = multipart::boundary();
        let body = multipart::encode(
            &b,
            &[
                Part::field("files[0].path", path),
                Part::file("files[0].file", path, data),
            ],
        );
        let resp = self
            .request(
                Method::POST,
                self.toolbox(sb, "/files/bulk-upload")?,
                CALL_TIMEOUT,
            )
            .header(reqwest::header::CONTENT_TYPE, multipart::content_type(&b))
            .body(body)
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        Self::answer(resp)
            .await
            .map(|_| ())
            .map_err(|a| Self::toolbox_error(a, path))
    }

    /// `POST /files/bulk-download` of one file; `NotFound` when the toolbox says so.
    pub async fn download(&self, sb: &Sandbox, path: &str) -> ProviderResult<Vec<u8>> {
        let resp = self
            .request(
                Method::POST,
                self.toolbox(sb, "/files/bulk-download")?,
                CALL_TIMEOUT,
            )
            .header(reqwest::header::ACCEPT, "multipart/form-data")
            .json(&BulkDownload {
                paths: vec![path.to_string()],
            })
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        let resp = Self::answer(resp)
            .await
            .map_err(|a| Self::toolbox_error(a, path))?;
        let boundary = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(multipart::boundary_of)
            .ok_or_else(|| {
                ProviderError::Failed("daytona download: not a multipart answer".into())
            })?;
        let body = crate::providers::remote::body_within(resp, MAX_DOWNLOAD)
            .await
            .map_err(|e| unreachable(&e))?
            .ok_or_else(|| ProviderError::TooLarge(path.chars().take(200).collect()))?;
        let parts = multipart::decode(&body, &boundary, 4).ok_or_else(|| {
            ProviderError::Failed("daytona download: a broken multipart answer".into())
        })?;
        let part = parts
            .into_iter()
            .find(|p| p.filename.as_deref() == Some(path))
            .ok_or_else(|| ProviderError::Failed("daytona download: the file is missing".into()))?;
        match part.name.as_str() {
            "file" => Ok(part.data),
            _ => {
                let text = String::from_utf8_lossy(&part.data);
                let status = serde_json::from_str::<ErrorBody>(&text)
                    .map(|e| e.status_code)
                    .unwrap_or(0);
                if status == 404 || text.contains("no such file") || text.contains("not found") {
                    Err(ProviderError::NotFound(path.chars().take(200).collect()))
                } else {
                    Err(ProviderError::Failed(format!(
                        "daytona download: {}",
                        text.chars().take(200).collect::<String>()
                    )))
                }
            }
        }
    }

    /// `GET /files?path=`.
    pub async fn list(&self, sb: &Sandbox, path: &str) -> ProviderResult<Vec<FileInfo>> {
        let resp = self
            .request(
                Method::GET,
                format!("{}?path={}", self.toolbox(sb, "/files")?, query(path)),
                CALL_TIMEOUT,
            )
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        let resp = Self::answer(resp)
            .await
            .map_err(|a| Self::toolbox_error(a, path))?;
        json_within(resp, MAX_ANSWER, "daytona toolbox answer").await
    }
}

/// An id as one URL path segment (ids are opaque: nothing in them may add or remove a
/// segment; an empty or all-dot id names no sandbox).
pub(crate) fn seg(id: &str) -> String {
    if id.bytes().all(|b| b == b'.') {
        return "_".into();
    }
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A query value, percent-encoded.
pub(crate) fn query(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_cannot_add_path_segments() {
        assert_eq!(seg("ab-1_2.3"), "ab-1_2.3");
        assert_eq!(seg("../x"), "..%2Fx");
        assert_eq!(seg("a?b#c"), "a%3Fb%23c");
        assert_eq!(seg(".."), "_");
        assert_eq!(seg(""), "_");
        assert_eq!(query("/home/user/a b&c"), "/home/user/a%20b%26c");
    }
}
