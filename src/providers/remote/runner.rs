//! The desktop runtime's [`CommandRunner`] on a vendor's sandbox: every runtime script goes
//! through the vendor's run call, with the runtime's minimal environment.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rakazo_actors::provider::{ExecOutput, ProviderError};

use super::{RemoteCommand, RemoteSandboxes};
use crate::desktop::DesktopError;
use crate::desktop::command::{CommandRunner, minimal_env};

/// Runs scripts in one sandbox.
pub struct RemoteRunner<V: RemoteSandboxes> {
    /// The vendor.
    pub vendor: Arc<V>,
    /// The connected sandbox.
    pub session: V::Session,
}

#[async_trait]
impl<V: RemoteSandboxes> CommandRunner for RemoteRunner<V> {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        let command = RemoteCommand {
            script: script.to_string(),
            cwd: "/".into(),
            env: minimal_env(),
            timeout,
        };
        self.vendor
            .run(&self.session, &command)
            .await
            .map_err(|e| match e {
                ProviderError::MachineGone => DesktopError::Command("machine gone".into()),
                other => DesktopError::Command(other.to_string()),
            })
    }
}
