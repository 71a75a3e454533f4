//! The HTTP client of the supervisor (`rakazo supervisor`), with its errors translated into
//! [`ProviderError`] here: a 404 / `MACHINE_GONE` answer is [`ProviderError::MachineGone`].

use std::time::Duration;

use rakazo_actors::provider::{ProviderError, ProviderResult};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::supervisor::wire::{
    AskAnswer, AskBody, ComputerInfo, CreateComputer, CreatePooled, DesktopEnter, DesktopUsage,
    ErrorBody, ErrorCode, ExecBody, ExecResult, Health, ImageStatus, PoolRenewal,
};

/// How long a health check waits for the supervisor.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

/// Deadline of every call but exec (creating a container may take a few seconds).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of a create: the supervisor builds a missing computer image first (about ten
/// minutes from Debian's packages on a fresh machine), and the first computer waits for it.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Extra time an exec call gets past the script's own deadline.
const EXEC_SLACK: Duration = Duration::from_secs(30);

/// A client of one supervisor.
#[derive(Clone)]
pub struct SupervisorClient {
    http: reqwest::Client,
    /// Base URL without a trailing slash.
    base: String,
    /// `SANDBOX_SUPERVISOR_TOKEN` (never logged).
    token: String,
}

impl SupervisorClient {
    /// A client of the supervisor at `base` (for example `http://127.0.0.1:7091`).
    pub fn new(base: &str, token: &str) -> ProviderResult<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| ProviderError::Failed(format!("supervisor client: {e}")))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        timeout: Duration,
    ) -> ProviderResult<Option<T>> {
        self.call_coded(method, path, body, timeout)
            .await
            .map_err(|(_, e)| e)
    }

    /// [`Self::call`], keeping the supervisor's error code of a refusal.
    async fn call_coded<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        timeout: Duration,
    ) -> Result<Option<T>, (Option<ErrorCode>, ProviderError)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(timeout);
        if let Some(body) = body {
            req = req.json(body);
        }
        // The error text of reqwest names the URL (a host): keep only its kind.
        let resp = req.send().await.map_err(|e| {
            let kind = if e.is_timeout() {
                "timeout"
            } else {
                "connection"
            };
            (
                None,
                ProviderError::Failed(format!("supervisor unreachable ({kind})")),
            )
        })?;
        let status = resp.status();
        if status == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        if status.is_success() {
            return resp.json::<T>().await.map(Some).map_err(|e| {
                (
                    None,
                    ProviderError::Failed(format!("supervisor answer: {}", e.without_url())),
                )
            });
        }
        let err: Option<ErrorBody> = resp.json().await.ok();
        let code = err.as_ref().map(|e| e.code);
        Err((
            code,
            match err {
                Some(ErrorBody {
                    code: ErrorCode::MachineGone,
                    ..
                }) => ProviderError::MachineGone,
                Some(ErrorBody { code, message }) => {
                    ProviderError::Failed(format!("supervisor: {code:?}: {message}"))
                }
                None if status == reqwest::StatusCode::NOT_FOUND => ProviderError::MachineGone,
                None => ProviderError::Failed(format!("supervisor: HTTP {}", status.as_u16())),
            },
        ))
    }

    fn some<T>(v: Option<T>) -> ProviderResult<T> {
        v.ok_or_else(|| ProviderError::Failed("supervisor answered without a body".into()))
    }

    /// Whether the supervisor and its Docker engine answer, and the egress guard's state.
    pub async fn health(&self) -> ProviderResult<Health> {
        Self::some(
            self.call::<Health>(
                reqwest::Method::GET,
                "/v1/health",
                None::<&()>,
                HEALTH_TIMEOUT,
            )
            .await?,
        )
    }

    /// Whether the computer image is on the engine.
    pub async fn image_status(&self) -> ProviderResult<ImageStatus> {
        Self::some(
            self.call::<ImageStatus>(
                reqwest::Method::GET,
                "/v1/image",
                None::<&()>,
                HEALTH_TIMEOUT,
            )
            .await?,
        )
    }

    /// Makes the computer image present (the supervisor builds a missing one of the built-in
    /// recipe); returns once it is.
    pub async fn ensure_image(&self) -> ProviderResult<ImageStatus> {
        Self::some(
            self.call::<ImageStatus>(
                reqwest::Method::POST,
                "/v1/image",
                None::<&()>,
                CREATE_TIMEOUT,
            )
            .await?,
        )
    }

    /// Creates and starts a computer.
    pub async fn create(&self, req: &CreateComputer) -> ProviderResult<ComputerInfo> {
        Self::some(
            self.call(
                reqwest::Method::POST,
                "/v1/computers",
                Some(req),
                CREATE_TIMEOUT,
            )
            .await?,
        )
    }

    /// Creates and starts a pooled computer for `owner` (the image must be there).
    pub async fn create_pooled(&self, owner: &str) -> ProviderResult<ComputerInfo> {
        let body = CreatePooled {
            owner: owner.to_string(),
        };
        Self::some(
            self.call(reqwest::Method::POST, "/v1/pool", Some(&body), CALL_TIMEOUT)
                .await?,
        )
    }

    /// `owner`'s pool lives on; the ids of its unclaimed computers that are running.
    pub async fn renew_pool(&self, owner: &str) -> ProviderResult<Vec<String>> {
        let path = format!("/v1/pool/{}/renew", path_segment(owner)?);
        let answer: PoolRenewal = Self::some(
            self.call(reqwest::Method::POST, &path, None::<&()>, HEALTH_TIMEOUT)
                .await?,
        )?;
        Ok(answer.containers)
    }

    /// Claims the pooled computer `id` for `req`; `None` when the supervisor refused because
    /// the computer's home holds files (the pooled computer stays unclaimed).
    pub async fn claim(
        &self,
        id: &str,
        req: &CreateComputer,
    ) -> ProviderResult<Option<ComputerInfo>> {
        let path = format!("/v1/computers/{}/claim", path_segment(id)?);
        match self
            .call_coded(reqwest::Method::POST, &path, Some(req), CALL_TIMEOUT)
            .await
        {
            Ok(info) => Self::some(info).map(Some),
            Err((Some(ErrorCode::HomeInUse), _)) => Ok(None),
            Err((_, e)) => Err(e),
        }
    }

    /// The computer `id`.
    pub async fn inspect(&self, id: &str) -> ProviderResult<ComputerInfo> {
        Self::some(
            self.call(
                reqwest::Method::GET,
                &format!("/v1/computers/{}", path_segment(id)?),
                None::<&()>,
                CALL_TIMEOUT,
            )
            .await?,
        )
    }

    /// The computer of `home_key`, found by its labels.
    pub async fn find(&self, home_key: &str) -> ProviderResult<ComputerInfo> {
        Self::some(
            self.call(
                reqwest::Method::GET,
                &format!("/v1/computers?homeKey={}", path_segment(home_key)?),
                None::<&()>,
                CALL_TIMEOUT,
            )
            .await?,
        )
    }

    /// Starts the computer `id` if it is stopped.
    pub async fn start(&self, id: &str) -> ProviderResult<ComputerInfo> {
        Self::some(
            self.call(
                reqwest::Method::POST,
                &format!("/v1/computers/{}/start", path_segment(id)?),
                None::<&()>,
                CALL_TIMEOUT,
            )
            .await?,
        )
    }

    /// Stops the computer `id`.
    pub async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.call::<()>(
            reqwest::Method::POST,
            &format!("/v1/computers/{}/stop", path_segment(id)?),
            None::<&()>,
            CALL_TIMEOUT,
        )
        .await
        .map(|_| ())
    }

    /// Removes the computer `id`.
    pub async fn remove(&self, id: &str) -> ProviderResult<()> {
        self.call::<()>(
            reqwest::Method::DELETE,
            &format!("/v1/computers/{}", path_segment(id)?),
            None::<&()>,
            CALL_TIMEOUT,
        )
        .await
        .map(|_| ())
    }

    /// Runs a script in the computer `id` as uid 1000. Dropping the future before the answer
    /// asks the supervisor to kill the script (its run id is chosen here for that).
    pub async fn exec(&self, id: &str, body: &ExecBody) -> ProviderResult<ExecResult> {
        let timeout = Duration::from_millis(body.timeout_ms) + EXEC_SLACK;
        let run_id = uuid::Uuid::new_v4().simple().to_string();
        let body = ExecBody {
            run_id: Some(run_id.clone()),
            ..body.clone()
        };
        let mut guard = KillOnDrop {
            client: Some(self.clone()),
            container: path_segment(id)?.to_string(),
            run_id,
        };
        let result = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/computers/{}/exec", path_segment(id)?),
                Some(&body),
                timeout,
            )
            .await;
        guard.client = None;
        Self::some(result?)
    }

    /// Asks a helper kept by the exec agent of computer `id` one line (see [`AskBody`]).
    pub async fn ask(&self, id: &str, body: &AskBody) -> ProviderResult<AskAnswer> {
        let timeout = Duration::from_millis(body.timeout_ms) + EXEC_SLACK;
        Self::some(
            self.call(
                reqwest::Method::POST,
                &format!("/v1/computers/{}/ask", path_segment(id)?),
                Some(body),
                timeout,
            )
            .await?,
        )
    }

    /// Creates desktop `name`'s control group in computer `id` with the limits in `body` and
    /// moves the processes carrying its tag into it.
    pub async fn desktop_enter(
        &self,
        id: &str,
        name: &str,
        body: &DesktopEnter,
    ) -> ProviderResult<()> {
        self.desktop_call::<()>(reqwest::Method::PUT, id, name, "", Some(body))
            .await
            .map(|_| ())
    }

    /// Freezes or thaws desktop `name` of computer `id`.
    pub async fn desktop_freeze(&self, id: &str, name: &str, frozen: bool) -> ProviderResult<()> {
        let action = if frozen { "/freeze" } else { "/thaw" };
        self.desktop_call::<()>(reqwest::Method::POST, id, name, action, None::<&()>)
            .await
            .map(|_| ())
    }

    /// CPU time, OOM kills and frozen state of desktop `name` of computer `id`.
    pub async fn desktop_usage(&self, id: &str, name: &str) -> ProviderResult<DesktopUsage> {
        Self::some(
            self.desktop_call(reqwest::Method::GET, id, name, "", None::<&()>)
                .await?,
        )
    }

    /// Removes desktop `name`'s group of computer `id`.
    pub async fn desktop_remove(&self, id: &str, name: &str) -> ProviderResult<()> {
        self.desktop_call::<()>(reqwest::Method::DELETE, id, name, "", None::<&()>)
            .await
            .map(|_| ())
    }

    /// Thaws every desktop of computer `id`.
    pub async fn thaw_desktops(&self, id: &str) -> ProviderResult<()> {
        self.call::<()>(
            reqwest::Method::POST,
            &format!("/v1/computers/{}/thaw-desktops", path_segment(id)?),
            None::<&()>,
            CALL_TIMEOUT,
        )
        .await
        .map(|_| ())
    }

    async fn desktop_call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        id: &str,
        name: &str,
        action: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> ProviderResult<Option<T>> {
        let path = format!(
            "/v1/computers/{}/desktops/{}{action}",
            path_segment(id)?,
            path_segment(name)?
        );
        self.call(method, &path, body, CALL_TIMEOUT).await
    }

    async fn kill(&self, id: &str, run_id: &str) {
        let _ = self
            .call::<()>(
                reqwest::Method::POST,
                &format!("/v1/computers/{id}/exec/{run_id}/kill"),
                None::<&()>,
                CALL_TIMEOUT,
            )
            .await;
        tracing::info!("docker.exec.cancelled");
    }
}

/// Container ids and home keys are plain identifiers; anything else never reaches a URL.
fn path_segment(s: &str) -> ProviderResult<&str> {
    crate::desktop::check_id(s).map_err(|_| ProviderError::MachineGone)?;
    Ok(s)
}

/// Asks the supervisor to kill an exec whose caller went away, unless disarmed.
struct KillOnDrop {
    client: Option<SupervisorClient>,
    container: String,
    run_id: String,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let (container, run_id) = (self.container.clone(), self.run_id.clone());
            handle.spawn(async move { client.kill(&container, &run_id).await });
        }
    }
}
