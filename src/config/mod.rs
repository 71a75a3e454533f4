//! Typed configuration: `config/default.toml`, an optional TOML file, then the environment.
//!
//! Parsing reads through the [`Env`] trait, which a `HashMap` also implements, so tests never
//! touch the process environment. An invalid value is one [`ConfigError`] line naming the
//! variable, the value and what is accepted.

pub mod egress;
mod vars;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use vars::{ENVIRONMENTS, PROVIDER_ALIASES, PROVIDERS, VARS, Var, render_example};

/// The built-in defaults, compiled in.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Where variables come from.
pub trait Env {
    /// The value of a variable, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// A configuration failure; its display is the one line printed before exiting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A variable has a value outside what it accepts.
    #[error("invalid {var}={value:?}: expected {accepted}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// The offending value (secrets are not echoed).
        value: String,
        /// What is accepted.
        accepted: String,
    },
    /// A TOML file could not be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// A secret string: shown as `[redacted]` by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Deployment environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Environment {
    /// Production: host-executing providers are refused.
    Production,
    /// Local development.
    Development,
    /// Automated tests.
    Test,
}

/// Object storage settings (present when `OBJECT_STORAGE_BUCKET` is set).
#[derive(Clone, Debug)]
pub struct ObjectStorage {
    /// Bucket name.
    pub bucket: String,
    /// Endpoint URL (S3-compatible services).
    pub endpoint: Option<String>,
    /// Region.
    pub region: String,
    /// Access key id.
    pub access_key_id: Option<Secret>,
    /// Secret key.
    pub secret_access_key: Option<Secret>,
    /// Key prefix the deployment's root sits under (`OBJECT_STORAGE_PREFIX`).
    pub prefix: Option<String>,
}

/// Network of docker computers (`SANDBOX_DOCKER_NETWORK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DockerNetwork {
    /// Docker's default bridge: outbound access; the gateway port is published on loopback.
    Bridge,
    /// No network interface but loopback.
    None,
}

/// How the supervisor shapes computer containers (`SANDBOX_DOCKER_*`).
#[derive(Clone, Debug, PartialEq)]
pub struct DockerSettings {
    /// Image reference; `None` = the built-in recipe's tag.
    pub image: Option<String>,
    /// CPU ceiling in billionths of a CPU (0 = none).
    pub nano_cpus: i64,
    /// Memory ceiling in bytes (0 = none).
    pub memory_bytes: i64,
    /// Process ceiling (0 = none).
    pub pids_limit: i64,
    /// Network mode.
    pub network: DockerNetwork,
    /// The egress guard of bridged computers (`SANDBOX_EGRESS_*`).
    pub egress: EgressSettings,
}

/// The egress guard (`SANDBOX_EGRESS_GUARD`, `SANDBOX_EGRESS_ALLOW`, `SANDBOX_EGRESS_NETWORK`):
/// bridged computers join a dedicated Docker network whose private destinations are refused.
#[derive(Clone, Debug, PartialEq)]
pub struct EgressSettings {
    /// Whether the guard is on (the default).
    pub guard: bool,
    /// Destinations opened despite the guard.
    pub allow: Vec<egress::EgressAllow>,
    /// Name of the dedicated Docker network.
    pub network: String,
}

impl Default for EgressSettings {
    fn default() -> Self {
        Self {
            guard: true,
            allow: Vec::new(),
            network: egress::DEFAULT_NETWORK.into(),
        }
    }
}

/// What one process of a deployment runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `rakazo serve`: the API and the worker's timers, jobs and reconcilers in one process.
    Both,
    /// `rakazo serve --no-worker`: the API only.
    Api,
    /// `rakazo worker`: timers, jobs and reconcilers, and the internal endpoints.
    Worker,
}

impl Role {
    /// Whether this process serves the public API.
    pub fn api(self) -> bool {
        matches!(self, Self::Both | Self::Api)
    }

    /// Whether this process runs timers, jobs and reconcilers.
    pub fn worker(self) -> bool {
        matches!(self, Self::Both | Self::Worker)
    }

    /// The name health reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Both => "serve",
            Self::Api => "api",
            Self::Worker => "worker",
        }
    }
}

/// How kubernetes computers are shaped (`KUBERNETES_*`, `RAKAZO_COMPUTER_IMAGE*`).
#[derive(Clone, Debug, PartialEq)]
pub struct KubernetesSettings {
    /// `KUBERNETES_NAMESPACE`: the namespace of computer pods.
    pub namespace: String,
    /// `RAKAZO_COMPUTER_IMAGE` with `RAKAZO_COMPUTER_IMAGE_TAG`; `None` = the built-in
    /// recipe's tag.
    pub image: Option<String>,
    /// `KUBERNETES_SANDBOX_CPU_REQUEST` (a Kubernetes quantity; empty = none).
    pub cpu_request: String,
    /// `KUBERNETES_SANDBOX_CPU_LIMIT`.
    pub cpu_limit: String,
    /// `KUBERNETES_SANDBOX_MEMORY_REQUEST`.
    pub memory_request: String,
    /// `KUBERNETES_SANDBOX_MEMORY_LIMIT`.
    pub memory_limit: String,
    /// `KUBERNETES_SANDBOX_HOME_CLAIM` and its colocation: homes mounted from the claim that
    /// holds `DATA_DIR` (`None`: homes are copied through `pods/exec`).
    pub home_claim: Option<HomeClaim>,
}

/// A PersistentVolumeClaim holding `DATA_DIR`, from which computer pods mount
/// `homes/<home key>` at their workspace.
#[derive(Clone, Debug, PartialEq)]
pub struct HomeClaim {
    /// `KUBERNETES_SANDBOX_HOME_CLAIM`: the claim's name, in the computers' namespace.
    pub claim: String,
    /// `KUBERNETES_SANDBOX_HOME_COLOCATE_NAMESPACE`: the namespace of the pods that hold the
    /// volume (the API's).
    pub colocate_namespace: String,
    /// `KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS`: their labels; a required pod affinity.
    pub colocate_labels: std::collections::BTreeMap<String, String>,
}

/// Whether `v` is a DNS-1123 label or subdomain (a claim or namespace name).
fn is_dns_name(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 253
        && v.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// `KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS`: a JSON object of label names to values.
fn parse_labels(raw: &str) -> Result<std::collections::BTreeMap<String, String>, &'static str> {
    const ACCEPTED: &str =
        "a JSON object of label names to string values, such as {\"app\":\"rakazo-api\"}";
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_str(raw).map_err(|_| ACCEPTED)?;
    let ok = |v: &str, max: usize| {
        v.len() <= max
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
    };
    if map.is_empty()
        || !map
            .iter()
            .all(|(k, v)| !k.is_empty() && ok(k, 253) && ok(v, 63))
    {
        return Err(ACCEPTED);
    }
    Ok(map)
}

/// Whether `v` reads as a Kubernetes quantity (`500m`, `2`, `1.5`, `4Gi`, `512M`).
pub fn is_quantity(v: &str) -> bool {
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &v[digits.len()..];
    !digits.is_empty()
        && digits
            .parse::<f64>()
            .is_ok_and(|n| n.is_finite() && n >= 0.0)
        && ["", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"].contains(&suffix)
}

/// The whole configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// `RAKAZO_ENV`.
    pub environment: Environment,
    /// `RAKAZO_LOG`.
    pub log_filter: String,
    /// `RAKAZO_LISTEN`.
    pub listen: SocketAddr,
    /// `DATA_DIR`.
    pub data_dir: PathBuf,
    /// `DATABASE_URL`, defaulted to SQLite under the data dir.
    pub database_url: Secret,
    /// `SANDBOX_PROVIDER`.
    pub provider: String,
    /// `SANDBOX_IDLE_MS`.
    pub idle: Duration,
    /// `COMPUTER_MAX_ACTIVE_MS`.
    pub max_active: Duration,
    /// `COMPUTER_MAINTENANCE_HEARTBEAT_TIMEOUT_MS`: a maintenance operation without a worker
    /// heartbeat this long is interrupted.
    pub maintenance_heartbeat_timeout: Duration,
    /// `RUN_LEASE_TTL_MS`: lifetime of an execution lease unless renewed.
    pub run_lease_ttl: Duration,
    /// `MCP_SESSION_IDLE_MS`: an MCP session without a call for this long ends.
    pub mcp_session_idle: Duration,
    /// `RPC_WS_RECHECK_MS`: how often an open `/rpc/ws` socket's token is looked up again.
    pub ws_recheck: Duration,
    /// `RAKAZO_PROCESS_GONE_MS`: a silent process is gone after this long.
    pub process_gone_after: Duration,
    /// `RAKAZO_RECONCILE_INTERVAL_MS`: how often the computer reconciler passes.
    pub reconcile_interval: Duration,
    /// `RAKAZO_INTERNAL_URL`: where other processes reach this one (`None`: from the listen
    /// address).
    pub internal_url: Option<String>,
    /// `RAKAZO_HOST`: the loopback this process shares with others (`None`: named by the
    /// kernel's boot id and the network namespace).
    pub host: Option<String>,
    /// What this process runs (`serve`, `serve --no-worker`, `worker`); not a variable.
    pub role: Role,
    /// `SANDBOX_TEAM_SCREEN_LIMIT`.
    pub team_screen_limit: u32,
    /// Per-desktop control groups (`SANDBOX_DESKTOP_*`); `None` when the CPU weight is 0.
    pub desktop_limits: Option<crate::desktop::groups::DesktopLimits>,
    /// `SANDBOX_DESKTOP_WARM_STACKS`: spare desktops per computer.
    pub desktop_warm_stacks: usize,
    /// `SANDBOX_DESKTOP_START_NICE`: how far below the runtime's priority a desktop on this
    /// host without desktop groups starts (0 = not lowered).
    pub desktop_start_nice: u8,
    /// `SANDBOX_DOCKER_WARM_COMPUTERS`: docker computers created ahead.
    pub docker_warm_computers: usize,
    /// `SANDBOX_COMMAND_TIMEOUT_MS`.
    pub command_timeout: Duration,
    /// `SANDBOX_FAKE_SINGLE_SCREEN`.
    pub fake_single_screen: bool,
    /// `SANDBOX_SUPERVISOR_URL`.
    pub supervisor_url: String,
    /// `SANDBOX_SUPERVISOR_TOKEN`.
    pub supervisor_token: Option<Secret>,
    /// `SANDBOX_SUPERVISOR_LISTEN`.
    pub supervisor_listen: SocketAddr,
    /// Whether a supervisor was configured (`SANDBOX_SUPERVISOR_URL` or `_TOKEN` given): when
    /// not, `rakazo serve` with the docker provider starts its own ([`crate::managed`]).
    pub supervisor_configured: bool,
    /// Whether the supervisor is the one `rakazo serve` started (health: `managed`).
    pub supervisor_managed: bool,
    /// `SANDBOX_DOCKER_*`: how the supervisor shapes computer containers.
    pub docker: DockerSettings,
    /// `KUBERNETES_*`: how kubernetes computers are shaped.
    pub kubernetes: KubernetesSettings,
    /// `KUBECONFIG`: the kubeconfig file of the kubernetes provider (`None`: kube-rs's
    /// defaults, the in-cluster service account among them).
    pub kubeconfig: Option<PathBuf>,
    /// `SCREEN_CAPABILITY_SECRET`, 32 bytes.
    pub screen_secret: Option<Secret>,
    /// `RAKAZO_INTERNAL_TOKEN`, 32 bytes.
    pub internal_token: Option<Secret>,
    /// `SCREEN_NOVNC_DIR`: noVNC's files, served by the screen proxy.
    pub novnc_dir: PathBuf,
    /// `CONTENT_ENCRYPTION_KEY`, 32 bytes.
    pub content_key: Option<Secret>,
    /// `OBJECT_STORAGE_*`.
    pub object_storage: Option<ObjectStorage>,
    /// `HOME_REVISIONS_KEEP`.
    pub keep_revisions: u32,
    /// `RECORDING_RETENTION_DAYS` (0: runs are not recorded).
    pub recording_retention_days: u32,
    /// `RECORDING_MAX_RUN_BYTES`: sealed frame bytes kept per run.
    pub recording_max_run_bytes: u64,
    /// `RECORD_CONTROL_SESSIONS`: the screen of control sessions is recorded.
    pub record_control_sessions: bool,
    /// `SANDBOX_TEMPLATE`.
    pub template: String,
    /// `E2B_API_KEY`.
    pub e2b_api_key: Option<Secret>,
    /// `E2B_DOMAIN`.
    pub e2b_domain: String,
    /// `E2B_API_URL` (empty: `https://api.<domain>`).
    pub e2b_api_url: String,
    /// `NOVITA_API_KEY`.
    pub novita_api_key: Option<Secret>,
    /// `NOVITA_DOMAIN`.
    pub novita_domain: String,
    /// `NOVITA_API_URL` (empty: `https://api.<domain>`).
    pub novita_api_url: String,
    /// `DAYTONA_API_KEY`.
    pub daytona_api_key: Option<Secret>,
    /// `DAYTONA_API_URL`.
    pub daytona_api_url: String,
    /// `DAYTONA_TARGET`.
    pub daytona_target: String,
    /// `DAYTONA_SNAPSHOT`.
    pub daytona_snapshot: String,
    /// `BOAT_API_KEY`.
    pub boat_api_key: Option<Secret>,
    /// `BOAT_API_URL`.
    pub boat_api_url: String,
}

/// Layers: environment, then an optional file, then the built-in defaults.
struct Sources<'a> {
    env: &'a dyn Env,
    file: toml::Table,
    defaults: toml::Table,
}

fn toml_string(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        // Tables, arrays and dates are never valid values: the parser reports them.
        _ => "<not a scalar>".into(),
    }
}

impl Sources<'_> {
    fn get(&self, name: &str) -> Option<String> {
        let key = name.to_ascii_lowercase();
        self.env
            .var(name)
            .or_else(|| self.file.get(&key).map(toml_string))
            .or_else(|| self.defaults.get(&key).map(toml_string))
            .filter(|v| !v.is_empty())
    }

    fn invalid(&self, var: &'static str, value: &str, accepted: impl Into<String>) -> ConfigError {
        let secret = VARS.iter().any(|v| v.name == var && v.secret);
        ConfigError::Invalid {
            var,
            value: if secret {
                "[redacted]".into()
            } else {
                value.into()
            },
            accepted: accepted.into(),
        }
    }

    fn one_of(&self, var: &'static str, accepted: &[&str]) -> Result<String, ConfigError> {
        let value = self.get(var).unwrap_or_default();
        if accepted.contains(&value.as_str()) {
            Ok(value)
        } else {
            Err(self.invalid(var, &value, format!("one of {}", accepted.join(", "))))
        }
    }

    /// `SANDBOX_PROVIDER`, an alias given as the provider it names.
    fn provider(&self) -> Result<String, ConfigError> {
        let value = self.get("SANDBOX_PROVIDER").unwrap_or_default();
        match PROVIDER_ALIASES.iter().find(|(alias, _)| *alias == value) {
            Some((_, name)) => Ok((*name).to_owned()),
            None => self.one_of("SANDBOX_PROVIDER", PROVIDERS),
        }
    }

    fn number(&self, var: &'static str, max: u64) -> Result<u64, ConfigError> {
        let value = self.get(var).unwrap_or_default();
        value
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= max)
            .ok_or_else(|| self.invalid(var, &value, format!("a whole number from 0 to {max}")))
    }

    fn boolean(&self, var: &'static str) -> Result<bool, ConfigError> {
        match self.get(var).as_deref().unwrap_or("false") {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            other => Err(self.invalid(var, other, "true or false")),
        }
    }

    fn secret(&self, var: &'static str) -> Option<Secret> {
        self.get(var).map(Secret)
    }
}

fn parse_table(text: &str, path: &str) -> Result<toml::Table, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::File {
            path: path.into(),
            reason: e.message().into(),
        })?;
    for key in table.keys() {
        if !VARS.iter().any(|v| v.name.eq_ignore_ascii_case(key)) {
            return Err(ConfigError::File {
                path: path.into(),
                reason: format!("unknown key `{key}`"),
            });
        }
    }
    Ok(table)
}

const DAY_MS: u64 = 86_400_000;

impl Config {
    /// Load from `env` over an optional TOML file over the built-in defaults.
    pub fn load(env: &dyn Env, file: Option<&Path>) -> Result<Config, ConfigError> {
        let file = match file {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                    path: shown.clone(),
                    reason: e.to_string(),
                })?;
                parse_table(&text, &shown)?
            }
            None => toml::Table::new(),
        };
        let s = Sources {
            env,
            file,
            defaults: parse_table(DEFAULT_TOML, "config/default.toml")?,
        };

        let environment = match s.one_of("RAKAZO_ENV", ENVIRONMENTS)?.as_str() {
            "development" => Environment::Development,
            "test" => Environment::Test,
            _ => Environment::Production,
        };
        let listen_raw = s.get("RAKAZO_LISTEN").unwrap_or_default();
        let listen = listen_raw.parse().map_err(|_| {
            s.invalid(
                "RAKAZO_LISTEN",
                &listen_raw,
                "an address such as 127.0.0.1:3100",
            )
        })?;
        let data_dir = PathBuf::from(s.get("DATA_DIR").unwrap_or_else(|| "./data".into()));
        let database_url = match s.get("DATABASE_URL") {
            Some(url)
                if url.starts_with("sqlite:")
                    || url.starts_with("postgres://")
                    || url.starts_with("postgresql://") =>
            {
                url
            }
            Some(url) => {
                return Err(s.invalid("DATABASE_URL", &url, "a sqlite:// or postgres:// URL"));
            }
            None => format!("sqlite://{}?mode=rwc", data_dir.join("rakazo.db").display()),
        };
        let screen_secret = s.secret("SCREEN_CAPABILITY_SECRET");
        let well_formed =
            |k: &Secret| k.0.len() == 64 && k.0.bytes().all(|b| b.is_ascii_hexdigit());
        let accepted = "64 hexadecimal characters (32 bytes)";
        if screen_secret.as_ref().is_some_and(|k| !well_formed(k)) {
            return Err(s.invalid("SCREEN_CAPABILITY_SECRET", "", accepted));
        }
        let internal_token = s.secret("RAKAZO_INTERNAL_TOKEN");
        if internal_token.as_ref().is_some_and(|k| !well_formed(k)) {
            return Err(s.invalid("RAKAZO_INTERNAL_TOKEN", "", accepted));
        }
        let content_key = s.secret("CONTENT_ENCRYPTION_KEY");
        if content_key.as_ref().is_some_and(|k| !well_formed(k)) {
            return Err(s.invalid("CONTENT_ENCRYPTION_KEY", "", accepted));
        }
        let prefix = s.get("OBJECT_STORAGE_PREFIX");
        if let Some(p) = prefix
            .as_deref()
            .filter(|p| !crate::stores::deployment::valid_prefix(p))
        {
            return Err(s.invalid(
                "OBJECT_STORAGE_PREFIX",
                p,
                "/-separated segments of letters, digits, '-', '_' and '.'",
            ));
        }
        let object_storage = s.get("OBJECT_STORAGE_BUCKET").map(|bucket| ObjectStorage {
            bucket,
            endpoint: s.get("OBJECT_STORAGE_ENDPOINT"),
            region: s
                .get("OBJECT_STORAGE_REGION")
                .unwrap_or_else(|| "us-east-1".into()),
            access_key_id: s.secret("OBJECT_STORAGE_ACCESS_KEY_ID"),
            secret_access_key: s.secret("OBJECT_STORAGE_SECRET_ACCESS_KEY"),
            prefix,
        });
        let keep_revisions = s.number("HOME_REVISIONS_KEEP", 1000)? as u32;
        if keep_revisions == 0 {
            return Err(s.invalid("HOME_REVISIONS_KEEP", "0", "a whole number from 1 to 1000"));
        }
        let recording_retention_days = s.number("RECORDING_RETENTION_DAYS", 3650)? as u32;
        let recording_max_run_bytes = s.number("RECORDING_MAX_RUN_BYTES", 1 << 40)?;
        let at_least_a_second = |var: &'static str| -> Result<Duration, ConfigError> {
            let ms = s.number(var, DAY_MS)?;
            if ms < 1000 {
                return Err(s.invalid(
                    var,
                    &ms.to_string(),
                    format!("a whole number from 1000 to {DAY_MS}"),
                ));
            }
            Ok(Duration::from_millis(ms))
        };
        let run_lease_ttl = at_least_a_second("RUN_LEASE_TTL_MS")?;
        let mcp_session_idle = at_least_a_second("MCP_SESSION_IDLE_MS")?;
        let ws_recheck = at_least_a_second("RPC_WS_RECHECK_MS")?;
        let process_gone_after = at_least_a_second("RAKAZO_PROCESS_GONE_MS")?;
        let reconcile_interval = at_least_a_second("RAKAZO_RECONCILE_INTERVAL_MS")?;
        let supervisor_token = s.secret("SANDBOX_SUPERVISOR_TOKEN");
        if let Some(token) = &supervisor_token {
            let others = [&screen_secret, &content_key, &internal_token];
            if others
                .iter()
                .any(|o| o.as_ref().is_some_and(|o| o.0 == token.0))
            {
                return Err(s.invalid(
                    "SANDBOX_SUPERVISOR_TOKEN",
                    "",
                    "a token distinct from every other secret",
                ));
            }
        }
        let supervisor_listen_raw = s.get("SANDBOX_SUPERVISOR_LISTEN").unwrap_or_default();
        let supervisor_listen = supervisor_listen_raw.parse().map_err(|_| {
            s.invalid(
                "SANDBOX_SUPERVISOR_LISTEN",
                &supervisor_listen_raw,
                "an address such as 127.0.0.1:7091",
            )
        })?;
        let cpus_raw = s.get("SANDBOX_DOCKER_CPUS").unwrap_or_else(|| "0".into());
        let cpus = cpus_raw
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|c| c.is_finite() && (0.0..=1024.0).contains(c))
            .ok_or_else(|| {
                s.invalid(
                    "SANDBOX_DOCKER_CPUS",
                    &cpus_raw,
                    "a number of CPUs from 0 to 1024",
                )
            })?;
        let docker = DockerSettings {
            image: s.get("SANDBOX_DOCKER_IMAGE"),
            nano_cpus: (cpus * 1e9) as i64,
            memory_bytes: (s.number("SANDBOX_DOCKER_MEMORY_MB", 1 << 24)? as i64) << 20,
            pids_limit: s.number("SANDBOX_DOCKER_PIDS_LIMIT", 1 << 22)? as i64,
            network: match s
                .one_of("SANDBOX_DOCKER_NETWORK", &["bridge", "none"])?
                .as_str()
            {
                "none" => DockerNetwork::None,
                _ => DockerNetwork::Bridge,
            },
            egress: EgressSettings {
                guard: s.one_of("SANDBOX_EGRESS_GUARD", &["on", "off"])? == "on",
                allow: {
                    let raw = s.get("SANDBOX_EGRESS_ALLOW").unwrap_or_default();
                    egress::parse_allow(&raw)
                        .map_err(|why| s.invalid("SANDBOX_EGRESS_ALLOW", &raw, why))?
                },
                network: {
                    let raw = s.get("SANDBOX_EGRESS_NETWORK").unwrap_or_default();
                    egress::check_network_name(&raw)
                        .map_err(|why| s.invalid("SANDBOX_EGRESS_NETWORK", &raw, why))?;
                    raw
                },
            },
        };
        let quantity = |var: &'static str| -> Result<String, ConfigError> {
            let v = s.get(var).unwrap_or_default();
            if v.is_empty() || is_quantity(&v) {
                Ok(v)
            } else {
                Err(s.invalid(var, &v, "a Kubernetes quantity such as 500m, 2 or 4Gi"))
            }
        };
        let kubernetes = KubernetesSettings {
            namespace: s
                .get("KUBERNETES_NAMESPACE")
                .unwrap_or_else(|| "rakazo-sandboxes".into()),
            image: s.get("RAKAZO_COMPUTER_IMAGE").map(|image| {
                match s.get("RAKAZO_COMPUTER_IMAGE_TAG") {
                    Some(tag) => format!("{image}:{tag}"),
                    None => image,
                }
            }),
            cpu_request: quantity("KUBERNETES_SANDBOX_CPU_REQUEST")?,
            cpu_limit: quantity("KUBERNETES_SANDBOX_CPU_LIMIT")?,
            memory_request: quantity("KUBERNETES_SANDBOX_MEMORY_REQUEST")?,
            memory_limit: quantity("KUBERNETES_SANDBOX_MEMORY_LIMIT")?,
            home_claim: match s.get("KUBERNETES_SANDBOX_HOME_CLAIM") {
                None => None,
                Some(claim) => {
                    const CLAIM: &str = "KUBERNETES_SANDBOX_HOME_CLAIM";
                    const NS: &str = "KUBERNETES_SANDBOX_HOME_COLOCATE_NAMESPACE";
                    const LABELS: &str = "KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS";
                    if !is_dns_name(&claim) {
                        return Err(s.invalid(CLAIM, &claim, "a PersistentVolumeClaim name"));
                    }
                    let ns = s.get(NS).unwrap_or_default();
                    if !is_dns_name(&ns) {
                        return Err(s.invalid(
                            NS,
                            &ns,
                            "the namespace of the pods that hold the claim (required with KUBERNETES_SANDBOX_HOME_CLAIM)",
                        ));
                    }
                    let raw = s.get(LABELS).unwrap_or_default();
                    let labels = parse_labels(&raw).map_err(|why| {
                        s.invalid(
                            LABELS,
                            &raw,
                            format!("{why} (required with KUBERNETES_SANDBOX_HOME_CLAIM)"),
                        )
                    })?;
                    Some(HomeClaim {
                        claim,
                        colocate_namespace: ns,
                        colocate_labels: labels,
                    })
                }
            },
        };
        Ok(Config {
            environment,
            log_filter: s.get("RAKAZO_LOG").unwrap_or_else(|| "info".into()),
            listen,
            data_dir,
            database_url: Secret(database_url),
            provider: s.provider()?,
            idle: Duration::from_millis(s.number("SANDBOX_IDLE_MS", 30 * DAY_MS)?),
            max_active: Duration::from_millis(s.number("COMPUTER_MAX_ACTIVE_MS", 30 * DAY_MS)?),
            maintenance_heartbeat_timeout: Duration::from_millis(
                s.number("COMPUTER_MAINTENANCE_HEARTBEAT_TIMEOUT_MS", 30 * DAY_MS)?,
            ),
            run_lease_ttl,
            mcp_session_idle,
            ws_recheck,
            process_gone_after,
            reconcile_interval,
            internal_url: s
                .get("RAKAZO_INTERNAL_URL")
                .map(|u| u.trim_end_matches('/').to_owned()),
            host: s.get("RAKAZO_HOST"),
            role: Role::Both,
            team_screen_limit: s.number("SANDBOX_TEAM_SCREEN_LIMIT", 10_000)? as u32,
            desktop_limits: {
                let weight = s.number("SANDBOX_DESKTOP_CPU_WEIGHT", 10_000)? as u32;
                let memory_mb = s.number("SANDBOX_DESKTOP_MEMORY_MB", 1 << 30)?;
                let freeze_ms = s.number("SANDBOX_DESKTOP_FREEZE_MS", DAY_MS)?;
                (weight > 0).then_some(crate::desktop::groups::DesktopLimits {
                    cpu_weight: weight,
                    memory_mb,
                    freeze_after: (freeze_ms > 0).then(|| Duration::from_millis(freeze_ms)),
                    hold_starts: true,
                })
            },
            desktop_warm_stacks: s.number("SANDBOX_DESKTOP_WARM_STACKS", 16)? as usize,
            desktop_start_nice: s.number("SANDBOX_DESKTOP_START_NICE", 19)? as u8,
            docker_warm_computers: s.number("SANDBOX_DOCKER_WARM_COMPUTERS", 16)? as usize,
            command_timeout: Duration::from_millis(
                s.number("SANDBOX_COMMAND_TIMEOUT_MS", DAY_MS)?.max(1),
            ),
            fake_single_screen: s.boolean("SANDBOX_FAKE_SINGLE_SCREEN")?,
            supervisor_configured: supervisor_token.is_some()
                || s.env
                    .var("SANDBOX_SUPERVISOR_URL")
                    .is_some_and(|v| !v.is_empty())
                || s.file.contains_key("sandbox_supervisor_url"),
            supervisor_managed: false,
            supervisor_url: s.get("SANDBOX_SUPERVISOR_URL").unwrap_or_default(),
            supervisor_token,
            supervisor_listen,
            docker,
            kubernetes,
            kubeconfig: s.get("KUBECONFIG").map(PathBuf::from),
            screen_secret,
            internal_token,
            novnc_dir: PathBuf::from(
                s.get("SCREEN_NOVNC_DIR")
                    .unwrap_or_else(|| rakazo_web_proxy::viewer::DEFAULT_NOVNC_DIR.into()),
            ),
            content_key,
            object_storage,
            keep_revisions,
            recording_retention_days,
            recording_max_run_bytes,
            record_control_sessions: s.boolean("RECORD_CONTROL_SESSIONS")?,
            template: s
                .get("SANDBOX_TEMPLATE")
                .unwrap_or_else(|| "rakazo-computer".into()),
            e2b_api_key: s.secret("E2B_API_KEY"),
            e2b_domain: s.get("E2B_DOMAIN").unwrap_or_default(),
            e2b_api_url: s.get("E2B_API_URL").unwrap_or_default(),
            novita_api_key: s.secret("NOVITA_API_KEY"),
            novita_domain: s.get("NOVITA_DOMAIN").unwrap_or_default(),
            novita_api_url: s.get("NOVITA_API_URL").unwrap_or_default(),
            daytona_api_key: s.secret("DAYTONA_API_KEY"),
            daytona_api_url: s
                .get("DAYTONA_API_URL")
                .unwrap_or_else(|| crate::providers::daytona::client::DEFAULT_API_URL.into()),
            daytona_target: s.get("DAYTONA_TARGET").unwrap_or_default(),
            daytona_snapshot: s.get("DAYTONA_SNAPSHOT").unwrap_or_default(),
            boat_api_key: s.secret("BOAT_API_KEY"),
            boat_api_url: s
                .get("BOAT_API_URL")
                .unwrap_or_else(|| crate::providers::boat::client::DEFAULT_API_URL.into()),
        })
    }

    /// `sqlite` or `postgres`, as `/internal/health` reports it.
    pub fn database_kind(&self) -> &'static str {
        if self.database_url.0.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn docker_settings_and_a_distinct_supervisor_token() {
        let key = "ab".repeat(32);
        let same = Config::load(
            &env(&[
                ("SANDBOX_SUPERVISOR_TOKEN", &key),
                ("SCREEN_CAPABILITY_SECRET", &key),
            ]),
            None,
        );
        assert!(matches!(
            same,
            Err(ConfigError::Invalid {
                var: "SANDBOX_SUPERVISOR_TOKEN",
                ..
            })
        ));
        let c = Config::load(
            &env(&[
                ("SANDBOX_DOCKER_CPUS", "1.5"),
                ("SANDBOX_DOCKER_NETWORK", "none"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(c.docker.nano_cpus, 1_500_000_000);
        assert_eq!(c.docker.memory_bytes, 4096 << 20);
        assert_eq!(c.docker.pids_limit, 2048);
        assert_eq!(c.docker.network, DockerNetwork::None);
        assert_eq!(c.supervisor_listen, "127.0.0.1:7091".parse().unwrap());
        assert!(Config::load(&env(&[("SANDBOX_DOCKER_NETWORK", "host")]), None).is_err());
    }

    #[test]
    fn every_documented_default_is_built_in() {
        let built_in = parse_table(DEFAULT_TOML, "config/default.toml").unwrap();
        for var in VARS.iter().filter(|v| !v.default.is_empty()) {
            let key = var.name.to_ascii_lowercase();
            assert_eq!(
                built_in.get(&key).map(toml_string).as_deref(),
                Some(var.default),
                "{} in config/default.toml",
                var.name
            );
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = Config::load(&env(&[]), None).unwrap();
        assert_eq!(c.provider, "docker");
        assert_eq!(c.idle, Duration::from_millis(600_000));
        assert_eq!(c.max_active, Duration::from_millis(7_200_000));
        assert_eq!(c.command_timeout, Duration::from_millis(300_000));
        assert_eq!(c.team_screen_limit, 0);
        assert_eq!(
            c.desktop_limits,
            Some(crate::desktop::groups::DesktopLimits {
                cpu_weight: 100,
                memory_mb: 2048,
                freeze_after: Some(Duration::from_millis(300_000)),
                hold_starts: true,
            })
        );
        let off = Config::load(&env(&[("SANDBOX_DESKTOP_CPU_WEIGHT", "0")]), None).unwrap();
        assert_eq!(off.desktop_limits, None);
        assert!(Config::load(&env(&[("SANDBOX_DESKTOP_CPU_WEIGHT", "10001")]), None).is_err());
        assert_eq!(c.listen.to_string(), "127.0.0.1:3100");
        assert_eq!(c.database_kind(), "sqlite");
        assert_eq!(c.keep_revisions, 3);
        assert_eq!(c.run_lease_ttl, Duration::from_millis(300_000));
        assert_eq!(c.mcp_session_idle, Duration::from_millis(1_800_000));
        assert!(Config::load(&env(&[("MCP_SESSION_IDLE_MS", "999")]), None).is_err());
        assert_eq!(c.environment, Environment::Production);
    }

    #[test]
    fn unknown_provider_lists_every_accepted_name() {
        let err = Config::load(&env(&[("SANDBOX_PROVIDER", "bogus")]), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SANDBOX_PROVIDER") && err.contains("bogus"),
            "{err}"
        );
        for name in PROVIDERS {
            assert!(err.contains(name), "{err} lacks {name}");
        }
    }

    #[test]
    fn boat_names_the_box_provider() {
        for (alias, name) in [("boat", "box"), ("boat-emulator", "box-emulator")] {
            let config = Config::load(&env(&[("SANDBOX_PROVIDER", alias)]), None).unwrap();
            assert_eq!(config.provider, name);
        }
    }

    #[test]
    fn a_home_claim_needs_its_colocation() {
        let claim = ("KUBERNETES_SANDBOX_HOME_CLAIM", "rakazo-data");
        let ns = ("KUBERNETES_SANDBOX_HOME_COLOCATE_NAMESPACE", "rakazo");
        let labels = (
            "KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS",
            r#"{"app":"rakazo-api"}"#,
        );
        let err = Config::load(&env(&[claim]), None).unwrap_err().to_string();
        assert!(
            err.contains("KUBERNETES_SANDBOX_HOME_COLOCATE_NAMESPACE"),
            "{err}"
        );
        let err = Config::load(&env(&[claim, ns]), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS"),
            "{err}"
        );
        for bad in ["[]", "{}", r#"{"app":1}"#, r#"{"a b":"c"}"#] {
            let bad = ("KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS", bad);
            assert!(
                Config::load(&env(&[claim, ns, bad]), None).is_err(),
                "{bad:?}"
            );
        }
        let bad_claim = ("KUBERNETES_SANDBOX_HOME_CLAIM", "../data");
        assert!(Config::load(&env(&[bad_claim, ns, labels]), None).is_err());
        let c = Config::load(&env(&[claim, ns, labels]), None).unwrap();
        let home = c.kubernetes.home_claim.unwrap();
        assert_eq!(home.claim, "rakazo-data");
        assert_eq!(home.colocate_namespace, "rakazo");
        assert_eq!(home.colocate_labels["app"], "rakazo-api");
        assert_eq!(
            Config::load(&env(&[]), None).unwrap().kubernetes.home_claim,
            None
        );
    }

    #[test]
    fn invalid_numbers_name_the_variable() {
        let err = Config::load(&env(&[("SANDBOX_IDLE_MS", "soon")]), None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("invalid SANDBOX_IDLE_MS=\"soon\""), "{err}");
    }

    #[test]
    fn secrets_are_not_echoed() {
        let err = Config::load(&env(&[("DATABASE_URL", "mysql://u:hunter2@h/db")]), None)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
        let c = Config::load(&env(&[("SANDBOX_SUPERVISOR_TOKEN", "hunter2")]), None).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn env_wins_over_file_over_defaults() {
        let dir = std::env::temp_dir().join(format!("rakazo-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rakazo.toml");
        std::fs::write(&file, "sandbox_provider = \"fake\"\nsandbox_idle_ms = 5\n").unwrap();
        let c = Config::load(&env(&[("SANDBOX_IDLE_MS", "7")]), Some(&file)).unwrap();
        assert_eq!(
            (c.provider.as_str(), c.idle),
            ("fake", Duration::from_millis(7))
        );
        std::fs::write(&file, "no_such_key = 1\n").unwrap();
        assert!(
            Config::load(&env(&[]), Some(&file))
                .unwrap_err()
                .to_string()
                .contains("no_such_key")
        );
    }

    #[test]
    fn the_example_file_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/rakazo.env.example");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == render_example(),
            "config/rakazo.env.example is stale: run `rakazo config example > {path}`"
        );
    }

    #[test]
    fn every_default_toml_key_is_documented() {
        let table: toml::Table = DEFAULT_TOML.parse().unwrap();
        for var in VARS {
            let has = table.contains_key(&var.name.to_ascii_lowercase());
            assert_eq!(has, !var.default.is_empty(), "{} default", var.name);
        }
    }
}
