//! Provider adapters behind the `SandboxProvider` port, and the factory that picks one from
//! the configuration.

pub mod beneath;
pub mod docker;
pub mod fake;
pub mod kubernetes;
pub mod workspace_path;

use std::sync::Arc;

use rakazo_actors::provider::SandboxProvider;
use serde::Serialize;

use crate::config::{Config, Environment};
use crate::desktop::provider::{DesktopProvider, DesktopProviderConfig};

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
    }
}

/// Build the configured provider. A provider that cannot run is a setup failure reported by
/// health and the startup log, never a silent fall back to `none`.
pub fn build(config: &Config) -> Result<Built, String> {
    match config.provider.as_str() {
        "none" => Ok(Built { provider: None, status: ProviderStatus { sandbox: "none".into(), setup_error: None }, fake: None }),
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
            })
            .map_err(|e| format!("SANDBOX_PROVIDER=desktop: {e}"))?;
            Ok(Built {
                provider: Some(Arc::new(desktop)),
                status: ProviderStatus { sandbox: "desktop".into(), setup_error: None },
                fake: None,
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
            })
            .map_err(|e| format!("SANDBOX_PROVIDER=docker: {e}"))?;
            Ok(Built {
                provider: Some(Arc::new(docker)),
                status: ProviderStatus { sandbox: "docker".into(), setup_error: None },
                fake: None,
            })
        }
        "kubernetes" if config.kubernetes_home_claim.is_some() => Ok(unavailable(
            "KUBERNETES_SANDBOX_HOME_CLAIM is not built yet: unset it (kubernetes computers copy their home through pods/exec)".into(),
        )),
        "kubernetes" => {
            let provider = kubernetes::KubernetesProvider::new(kubernetes::KubernetesProviderConfig {
                settings: config.kubernetes.clone(),
                kubeconfig: config.kubeconfig.clone(),
                stash_dir: config.data_dir.join("run").join("kubernetes"),
                screen_limit: config.team_screen_limit as usize,
            });
            Ok(Built {
                provider: Some(Arc::new(provider)),
                status: ProviderStatus { sandbox: "kubernetes".into(), setup_error: None },
                fake: None,
            })
        }
        other => Ok(unavailable(format!("SANDBOX_PROVIDER={other} is not available in this build yet"))),
    }
}
