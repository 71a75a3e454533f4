//! Provider adapters behind the `SandboxProvider` port, and the factory that picks one from
//! the configuration.

pub mod beneath;
pub mod boat;
pub mod daytona;
pub mod docker;
pub mod e2b;
pub mod fake;
pub mod kubernetes;
pub mod remote;
pub mod workspace_path;

use std::sync::Arc;

use rakazo_actors::provider::SandboxProvider;
use serde::Serialize;

use crate::config::{Config, Environment};
use crate::desktop::provider::{DesktopProvider, DesktopProviderConfig};

/// Largest listing of one workspace folder accepted from a machine reached by commands (bigger
/// than one command's kept output, so those providers bring a large one by another way).
pub const MAX_LISTING: usize = 16 << 20;

/// What a folder too large to list is refused with (`TOO_LARGE`).
pub const LISTING_TOO_LARGE: &str =
    "the folder is too large to list: list a subfolder, or use shell (ls with a pattern, find)";

/// What the deployment's provider is, as `/internal/health` reports it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// The provider actually in use (`none` when none).
    pub sandbox: String,
    /// A setup failure that keeps the configured provider from running, stated plainly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup_error: Option<String>,
}

/// The factory's result.
pub struct Built {
    /// The provider, if one runs.
    pub provider: Option<Arc<dyn SandboxProvider>>,
    /// Health status.
    pub status: ProviderStatus,
    /// The fake, when it is the provider (test hooks).
    pub fake: Option<Arc<fake::FakeProvider>>,
    /// The in-process e2b-emulator, when it serves the provider (test hooks: kill a sandbox
    /// behind the API's back).
    pub e2b_emulator: Option<Arc<crate::emulators::e2b::Emulator>>,
    /// The in-process emulator's own API, when an emulator serves the provider (test hooks:
    /// act on a sandbox behind the API's back, as the vendor's console would).
    pub emulator_api: Option<EmulatorApi>,
}

/// Where an in-process emulator answers and the key it takes.
#[derive(Clone)]
pub struct EmulatorApi {
    /// The emulator's base URL (`http://127.0.0.1:<port>`).
    pub url: String,
    /// The API key the adapter uses with it.
    pub key: String,
}

impl std::fmt::Debug for EmulatorApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EmulatorApi({})", self.url)
    }
}

fn unavailable(reason: String) -> Built {
    tracing::error!(event = "sandbox.setup_failed", reason = %reason);
    Built {
        provider: None,
        status: ProviderStatus {
            sandbox: "none".into(),
            setup_error: Some(reason),
        },
        fake: None,
        e2b_emulator: None,
        emulator_api: None,
    }
}

/// Build the configured provider. A provider that cannot run is a setup failure reported by
/// health and the startup log, never a silent fall back to `none`.
pub async fn build(config: &Config) -> Result<Built, String> {
    match config.provider.as_str() {
        "none" => Ok(Built { provider: None, status: ProviderStatus { sandbox: "none".into(), setup_error: None }, fake: None, e2b_emulator: None, emulator_api: None }),
        "fake" => {
            let mode = if config.fake_single_screen {
                fake::ScreenMode::Single
            } else {
                fake::ScreenMode::Multi { limit: config.team_screen_limit }
            };
            let fake = Arc::new(fake::FakeProvider::new(mode));
            Ok(Built {
                provider: Some(fake.clone()),
                status: ProviderStatus { sandbox: "fake".into(), setup_error: None },
                fake: Some(fake),
                e2b_emulator: None,
                emulator_api: None,
            })
        }
        "desktop" => {
            let environment = match config.environment {
                Environment::Production => "production",
                Environment::Development => "development",
                Environment::Test => "test",
            };
            let desktop = DesktopProvider::new(DesktopProviderConfig {
                homes_root: config.data_dir.join("homes"),
                run_root: config.data_dir.join("run").join("desktop"),
                screen_limit: config.team_screen_limit as usize,
                first_display: 1,
                environment: environment.into(),
                limits: config.desktop_limits,
                warm_stacks: config.desktop_warm_stacks,
                start_nice: config.desktop_start_nice,
            })
            .map_err(|e| format!("SANDBOX_PROVIDER=desktop: {e}"))?;
            Ok(Built {
                provider: Some(Arc::new(desktop)),
                status: ProviderStatus { sandbox: "desktop".into(), setup_error: None },
                fake: None,
                e2b_emulator: None,
                emulator_api: None,
            })
        }
        "docker" if config.supervisor_token.as_ref().is_none_or(|t| t.0.is_empty()) => Ok(unavailable(
            "SANDBOX_PROVIDER=docker requires SANDBOX_SUPERVISOR_TOKEN (non-empty, distinct from other secrets)".into(),
        )),
        "docker" => {
            let token = config.supervisor_token.as_ref().map(|t| t.0.clone()).unwrap_or_default();
            let docker = docker::DockerProvider::new(docker::DockerProviderConfig {
                supervisor_url: config.supervisor_url.clone(),
                supervisor_token: token,
                screen_limit: config.team_screen_limit as usize,
                commands_only: false,
                warm_stacks: config.desktop_warm_stacks,
                limits: config.desktop_limits,
            })
            .map_err(|e| format!("SANDBOX_PROVIDER=docker: {e}"))?
            .with_warm_computers(config.docker_warm_computers);
            Ok(Built {
                provider: Some(Arc::new(docker)),
                status: ProviderStatus { sandbox: "docker".into(), setup_error: None },
                fake: None,
                e2b_emulator: None,
                emulator_api: None,
            })
        }
        "e2b" => {
            let Some(key) = config.e2b_api_key.as_ref().filter(|k| !k.0.trim().is_empty()) else {
                return Ok(unavailable("SANDBOX_PROVIDER=e2b requires E2B_API_KEY".into()));
            };
            let api_url = if config.e2b_api_url.is_empty() {
                format!("https://api.{}", config.e2b_domain)
            } else {
                config.e2b_api_url.clone()
            };
            let adapter = e2b::E2b::new(e2b::E2bConfig {
                kind: "e2b",
                vendor: e2b::Vendor::E2b,
                api_key: key.0.clone(),
                domain: config.e2b_domain.clone(),
                api_url,
                sandbox_url: None,
                template: config.template.clone(),
            })
            .map_err(|e| format!("SANDBOX_PROVIDER=e2b: {e}"))?;
            let provider = remote::provider::RemoteProvider::new(Arc::new(adapter), config.team_screen_limit as usize).with_warm_stacks(config.desktop_warm_stacks);
            Ok(Built {
                provider: Some(Arc::new(provider)),
                status: ProviderStatus { sandbox: "e2b".into(), setup_error: None },
                fake: None,
                e2b_emulator: None,
                emulator_api: None,
            })
        }
        kind @ ("e2b-emulator" | "novita-emulator") if config.supervisor_token.as_ref().is_none_or(|t| t.0.is_empty()) => Ok(unavailable(format!(
            "SANDBOX_PROVIDER={kind} runs its sandboxes as Docker computers: it requires the supervisor (SANDBOX_SUPERVISOR_TOKEN)"
        ))),
        kind @ ("e2b-emulator" | "novita-emulator") => {
            // Novita's mode of the same emulator, behind the same adapter as Novita.
            let (kind, novita) = if kind == "novita-emulator" { ("novita-emulator", true) } else { ("e2b-emulator", false) };
            let token = config.supervisor_token.as_ref().map(|t| t.0.clone()).unwrap_or_default();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("{kind}: {e}"))?;
            let running = crate::emulators::e2b::start(
                listener,
                crate::emulators::e2b::Settings {
                    supervisor_url: config.supervisor_url.clone(),
                    supervisor_token: token,
                    domain: crate::emulators::e2b::DOMAIN.into(),
                    novita,
                },
            )
            .await
            .map_err(|e| format!("SANDBOX_PROVIDER={kind}: {e}"))?;
            let url = format!("http://{}", running.addr);
            let emulator = running.emulator.clone();
            // The emulator serves as long as the process (its tasks are detached).
            drop(running);
            let api_key = format!("e2b_{}", crate::emulators::random_id(40));
            let emulator_api = EmulatorApi { url: url.clone(), key: api_key.clone() };
            let adapter = e2b::E2b::new(e2b::E2bConfig {
                kind,
                vendor: if novita { e2b::Vendor::Novita } else { e2b::Vendor::E2b },
                api_key,
                domain: crate::emulators::e2b::DOMAIN.into(),
                api_url: url.clone(),
                sandbox_url: Some(url),
                template: config.template.clone(),
            })
            .map_err(|e| format!("SANDBOX_PROVIDER={kind}: {e}"))?;
            let provider = remote::provider::RemoteProvider::new(Arc::new(adapter), config.team_screen_limit as usize).with_warm_stacks(config.desktop_warm_stacks);
            Ok(Built {
                provider: Some(Arc::new(provider)),
                status: ProviderStatus { sandbox: kind.into(), setup_error: None },
                fake: None,
                e2b_emulator: Some(emulator),
                emulator_api: Some(emulator_api),
            })
        }
        "novita" => {
            let Some(key) = config.novita_api_key.as_ref().filter(|k| !k.0.trim().is_empty()) else {
                return Ok(unavailable("SANDBOX_PROVIDER=novita requires NOVITA_API_KEY".into()));
            };
            if config.template.trim().is_empty() {
                return Ok(unavailable(
                    "SANDBOX_PROVIDER=novita requires SANDBOX_TEMPLATE (Novita has no stock fallback)".into(),
                ));
            }
            let api_url = if config.novita_api_url.is_empty() {
                format!("https://api.{}", config.novita_domain)
            } else {
                config.novita_api_url.clone()
            };
            let adapter = e2b::E2b::new(e2b::E2bConfig {
                kind: "novita",
                vendor: e2b::Vendor::Novita,
                api_key: key.0.clone(),
                domain: config.novita_domain.clone(),
                api_url,
                sandbox_url: None,
                template: config.template.clone(),
            })
            .map_err(|e| format!("SANDBOX_PROVIDER=novita: {e}"))?;
            remote_built(config, "novita", adapter)
        }
        "daytona" => {
            let Some(key) = config.daytona_api_key.as_ref().filter(|k| !k.0.trim().is_empty()) else {
                return Ok(unavailable("SANDBOX_PROVIDER=daytona requires DAYTONA_API_KEY".into()));
            };
            remote_built(config, "daytona", daytona_adapter(config, "daytona", config.daytona_api_url.clone(), key.0.clone())?)
        }
        "box" => {
            let Some(key) = config.boat_api_key.as_ref().filter(|k| !k.0.trim().is_empty()) else {
                return Ok(unavailable("SANDBOX_PROVIDER=box requires BOAT_API_KEY".into()));
            };
            remote_built(config, "box", boat_adapter("box", config.boat_api_url.clone(), key.0.clone())?)
        }
        "daytona-emulator" | "box-emulator" if config.supervisor_token.as_ref().is_none_or(|t| t.0.is_empty()) => Ok(unavailable(format!(
            "SANDBOX_PROVIDER={} runs its sandboxes as Docker computers: it requires the supervisor (SANDBOX_SUPERVISOR_TOKEN)",
            config.provider
        ))),
        "daytona-emulator" => {
            let (url, key) = start_emulator(config, "daytona")?;
            let api = EmulatorApi { url: url.clone(), key: key.clone() };
            let mut built = remote_built(config, "daytona-emulator", daytona_adapter(config, "daytona-emulator", format!("{url}/api"), key)?)?;
            built.emulator_api = Some(api);
            Ok(built)
        }
        "box-emulator" => {
            let (url, key) = start_emulator(config, "box")?;
            let api = EmulatorApi { url: url.clone(), key: key.clone() };
            let mut built = remote_built(config, "box-emulator", boat_adapter("box-emulator", format!("{url}/api/v1"), key)?)?;
            built.emulator_api = Some(api);
            Ok(built)
        }
        "kubernetes" => {
            let mut settings = config.kubernetes.clone();
            if settings.home_claim.is_some() && config.object_storage.is_some() {
                // Homes then live in the bucket, not on the claim: they are copied as usual.
                tracing::info!("kubernetes.home_claim.ignored");
                settings.home_claim = None;
            }
            let provider = kubernetes::KubernetesProvider::new(kubernetes::KubernetesProviderConfig {
                settings,
                kubeconfig: config.kubeconfig.clone(),
                stash_dir: config.data_dir.join("run").join("kubernetes"),
                screen_limit: config.team_screen_limit as usize,
                homes_root: config.data_dir.join("homes"),
                warm_stacks: config.desktop_warm_stacks,
            });
            Ok(Built {
                provider: Some(Arc::new(provider)),
                status: ProviderStatus { sandbox: "kubernetes".into(), setup_error: None },
                fake: None,
                e2b_emulator: None,
                emulator_api: None,
            })
        }
        other => Ok(unavailable(format!("SANDBOX_PROVIDER={other} is not available in this build yet"))),
    }
}

fn daytona_adapter(
    config: &Config,
    kind: &'static str,
    api_url: String,
    api_key: String,
) -> Result<daytona::adapter::Daytona, String> {
    daytona::adapter::Daytona::new(daytona::adapter::DaytonaConfig {
        kind,
        api_url,
        api_key,
        target: config.daytona_target.clone(),
        snapshot: config.daytona_snapshot.clone(),
        idle: config.idle,
    })
    .map_err(|e| format!("SANDBOX_PROVIDER={kind}: {e}"))
}

fn boat_adapter(
    kind: &'static str,
    api_url: String,
    api_key: String,
) -> Result<boat::adapter::Boat, String> {
    boat::adapter::Boat::new(boat::adapter::BoatConfig {
        kind,
        api_url,
        api_key,
    })
    .map_err(|e| format!("SANDBOX_PROVIDER={kind}: {e}"))
}

fn remote_built<V: remote::RemoteSandboxes>(
    config: &Config,
    kind: &str,
    adapter: V,
) -> Result<Built, String> {
    let provider =
        remote::provider::RemoteProvider::new(Arc::new(adapter), config.team_screen_limit as usize)
            .with_warm_stacks(config.desktop_warm_stacks);
    Ok(Built {
        provider: Some(Arc::new(provider)),
        status: ProviderStatus {
            sandbox: kind.into(),
            setup_error: None,
        },
        fake: None,
        e2b_emulator: None,
        emulator_api: None,
    })
}

/// Starts the daytona- or box-emulator in this process on a loopback port, with a fresh key
/// only this process knows; returns its base URL and the key.
fn start_emulator(config: &Config, vendor: &str) -> Result<(String, String), String> {
    use std::time::Duration;

    use crate::emulators::{boat as boat_emu, daytona as daytona_emu, machines::Machines};
    let token = config
        .supervisor_token
        .as_ref()
        .map(|t| t.0.clone())
        .unwrap_or_default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("{vendor}-emulator: {e}"))?;
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(|e| format!("{vendor}-emulator: {e}"))?
    );
    let key = format!("emu_{}", crate::emulators::random_id(40));
    let account = if vendor == "box" { "user" } else { "daytona" };
    let machines = Machines::new(&config.supervisor_url, &token, account)
        .map_err(|e| format!("{vendor}-emulator: {e}"))?;
    let server = if vendor == "box" {
        boat_emu::serve(
            listener,
            boat_emu::BoatEmulator::new(
                machines,
                boat_emu::Settings {
                    base_url: url.clone(),
                    key: Some(key.clone()),
                    snapshot_retention: Duration::from_secs(7 * 24 * 3600),
                },
            ),
        )
    } else {
        daytona_emu::serve(
            listener,
            daytona_emu::DaytonaEmulator::new(
                machines,
                daytona_emu::Settings {
                    base_url: url.clone(),
                    key: Some(key.clone()),
                    minute: Duration::from_secs(60),
                },
            ),
        )
    }
    .map_err(|e| format!("{vendor}-emulator: {e}"))?;
    // Serves as long as the process.
    actix_rt::spawn(server);
    Ok((url, key))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(&env, None).unwrap()
    }

    #[actix_rt::test]
    async fn e2b_without_a_key_is_a_setup_error_and_with_one_it_is_e2b() {
        let built = build(&config(&[("SANDBOX_PROVIDER", "e2b")]))
            .await
            .unwrap();
        assert!(built.provider.is_none());
        assert_eq!(built.status.sandbox, "none");
        assert!(
            built
                .status
                .setup_error
                .as_deref()
                .is_some_and(|e| e.contains("E2B_API_KEY")),
            "{:?}",
            built.status.setup_error
        );
        let built = build(&config(&[
            ("SANDBOX_PROVIDER", "e2b"),
            ("E2B_API_KEY", "e2b_secret_key"),
        ]))
        .await
        .unwrap();
        assert_eq!(built.status.sandbox, "e2b");
        assert!(built.status.setup_error.is_none());
        let provider = built.provider.unwrap();
        let d = provider.describe();
        assert_eq!(d.kind, "e2b");
        assert!(d.capabilities.bills_while_running && d.capabilities.multi_screen);
        assert!(!d.capabilities.mounted_home);
    }

    #[actix_rt::test]
    async fn novita_without_a_key_is_a_setup_error_and_with_one_it_is_novita() {
        let built = build(&config(&[("SANDBOX_PROVIDER", "novita")]))
            .await
            .unwrap();
        assert!(built.provider.is_none());
        assert_eq!(built.status.sandbox, "none");
        let err = built.status.setup_error.unwrap();
        assert!(err.contains("NOVITA_API_KEY"), "{err}");
        let built = build(&config(&[
            ("SANDBOX_PROVIDER", "novita"),
            ("NOVITA_API_KEY", "sk_novita_key"),
        ]))
        .await
        .unwrap();
        assert_eq!(built.status.sandbox, "novita");
        let d = built.provider.unwrap().describe();
        assert_eq!(d.kind, "novita");
        assert!(d.capabilities.bills_while_running && d.capabilities.multi_screen);
    }

    #[actix_rt::test]
    async fn the_e2b_emulator_needs_the_supervisor() {
        let built = build(&config(&[("SANDBOX_PROVIDER", "e2b-emulator")]))
            .await
            .unwrap();
        assert!(built.provider.is_none());
        assert!(built.status.setup_error.is_some());
    }
}
