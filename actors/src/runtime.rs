//! What every actor of a computer shares: database, provider, store, event bus and settings.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;

use crate::clock::Clock;
use crate::entity::computer;
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::events::EventBus;
use crate::home_store::{HomeId, HomeStore};
use crate::keys::{self, KeyBytes};
use crate::owners::Forward;
use crate::provider::SandboxProvider;

/// Timing and capacity settings of computers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Suspend a computer after this long without use (0 = never).
    pub idle: Duration,
    /// Suspend after this long up in one stretch on billed providers (0 = never).
    pub max_active: Duration,
    /// A maintenance operation whose worker has not beaten this long is interrupted.
    pub maintenance_heartbeat_timeout: Duration,
    /// Default and maximum command timeout.
    pub command_timeout: Duration,
    /// Cap on active desktops per computer (0 = none).
    pub team_screen_limit: u32,
    /// Why the configured provider could not start (its setup error, as health reports it);
    /// `NO_PROVIDER` answers name it. `None` when no provider was asked for.
    pub provider_setup_error: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            idle: Duration::from_millis(600_000),
            max_active: Duration::from_millis(7_200_000),
            maintenance_heartbeat_timeout: Duration::from_millis(
                crate::maintenance::HEARTBEAT_TIMEOUT_MS as u64,
            ),
            command_timeout: Duration::from_millis(300_000),
            team_screen_limit: 0,
            provider_setup_error: None,
        }
    }
}

/// Shared dependencies of the actors.
pub struct Runtime {
    /// The database.
    pub db: DatabaseConnection,
    /// The provider in use; `None` runs the product without computers.
    pub provider: Option<Arc<dyn SandboxProvider>>,
    /// Durable workspace revisions.
    pub homes: Arc<dyn HomeStore>,
    /// Live updates.
    pub events: EventBus,
    /// Settings.
    pub settings: Settings,
    /// The deployment's master key; wraps the spaces' content keys.
    pub master_key: KeyBytes,
    /// How machine calls reach a computer another process owns (`None`: one process).
    pub forward: Option<Arc<dyn Forward>>,
    /// The time idle, uptime and heartbeat rules decide by.
    pub clock: Clock,
}

impl Runtime {
    /// The stored-workspace identity of a computer, with its (unwrapped) data key.
    pub async fn home_id(&self, row: &computer::Model) -> DomainResult<HomeId> {
        Ok(HomeId {
            home_key: row.home_key.clone(),
            storage_id: row.storage_id.clone(),
            data_key: keys::data_key(&self.db, &self.master_key, &row.id).await?,
        })
    }

    /// The provider, or `NO_PROVIDER` naming why none runs: the configured provider's setup
    /// error, or `SANDBOX_PROVIDER=none`.
    pub fn provider(&self) -> DomainResult<Arc<dyn SandboxProvider>> {
        self.provider.clone().ok_or_else(|| {
            let message = match &self.settings.provider_setup_error {
                Some(reason) => format!("the sandbox provider could not start: {reason}"),
                None => "no sandbox provider is configured (SANDBOX_PROVIDER=none)".to_owned(),
            };
            DomainError::new(ErrorCode::NoProvider, message)
        })
    }
}
