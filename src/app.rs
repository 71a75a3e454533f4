//! The composition root: configuration → database → provider → actors, shared by every
//! transport. `App::start` is what `rakazo serve` and the tests call.

use std::sync::Arc;

use actix::{Actor, Addr, Arbiter};
use rakazo_actors::checkpoint::Reason;
use rakazo_actors::computer::SaveWorkspace;
use rakazo_actors::events::EventBus;
use rakazo_actors::home_store::HomeStore;
use rakazo_actors::processes;
use rakazo_actors::reconciler::ComputerReconciler;
use rakazo_actors::registry::Registry;
use rakazo_actors::runtime::{Runtime, Settings};
use sea_orm::DatabaseConnection;

use rakazo_web_proxy::{GatewayActor, Keyring, ProxyConfig, ProxyState};

use crate::config::Config;
use crate::providers::{self, ProviderStatus};
use crate::screens::{GatewayRevoker, RouteBook, ScreenAuthority, Screens};
use crate::stores::archive::Limits;
use crate::stores::deployment;
use crate::stores::local::LocalHomeStore;
use crate::stores::reconciler::{ORPHAN_GRACE, RECONCILE_EVERY, Reconciler};
use crate::{auth, db, keyfile, recovery};

/// Why the app could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Database connection or migration failed.
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    /// The provider refused its configuration.
    #[error("{0}")]
    Provider(String),
    /// Bootstrap (operator token, data dir) failed.
    #[error("{0}")]
    Bootstrap(String),
}

/// File under `DATA_DIR` holding the generated internal credential.
pub const INTERNAL_TOKEN_FILE: &str = "internal-token";

/// Everything a request handler needs.
pub struct App {
    /// The configuration in force.
    pub config: Config,
    /// The database.
    pub db: DatabaseConnection,
    /// Live actors.
    pub registry: Arc<Registry>,
    /// What `/internal/health` reports about the provider.
    pub provider_status: ProviderStatus,
    /// The fake provider, when it is the one in use (tests drive its hooks).
    pub fake: Option<Arc<providers::fake::FakeProvider>>,
    /// The in-process e2b-emulator (`SANDBOX_PROVIDER=e2b-emulator`), for tests.
    pub e2b_emulator: Option<Arc<crate::emulators::e2b::Emulator>>,
    /// The in-process emulator's own API (`SANDBOX_PROVIDER=<vendor>-emulator`), for tests.
    pub emulator_api: Option<providers::EmulatorApi>,
    /// Live screens: capabilities, routes, revocation.
    pub screens: Screens,
    /// Live MCP sessions.
    pub mcp: crate::api::mcp::Sessions,
    /// Model-context economy of the agent tools.
    pub tools: crate::tools::Economy,
    /// Run recordings: their keys and limits.
    pub recorder: crate::recordings::Recorder,
    /// The screen proxy's state (mounted by the server).
    pub proxy: ProxyState,
    /// Where control sessions go: the in-process proxy's, and those a proxy in its own
    /// process reports over `/internal/control-session`.
    pub session_notes: Arc<crate::screens::TimelineNotes>,
    /// The screen authority (in process for the proxy, over `/internal/screen-authority` for
    /// a proxy elsewhere).
    pub authority: Arc<ScreenAuthority>,
    /// The credential of internal endpoints (`RAKAZO_INTERNAL_TOKEN` or
    /// `DATA_DIR/internal-token`), never an API token.
    pub internal_token: crate::config::Secret,
    /// The reconciler of orphaned stored revisions (object storage only).
    pub reconciler: Option<Addr<Reconciler>>,
    /// The reconciler of computers: adopts running machines no live process holds, closes
    /// stretches nobody saw end, releases expired grants (at start-up and on an interval);
    /// only in a process that runs the worker's part.
    pub computer_reconciler: Option<Addr<ComputerReconciler>>,
    /// Whether events reach and come from the deployment's other processes (Postgres).
    pub relayed: bool,
    /// The arbiter the actors run on; kept alive with the app.
    /// This process's lock (see `recovery`), held while the app lives.
    _process: recovery::ProcessLock,
    _arbiter: Arbiter,
}

impl App {
    /// Start the app; also returns the operator token when it was created just now.
    pub async fn start(config: Config) -> Result<(Arc<App>, Option<String>), StartError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            StartError::Bootstrap(format!("DATA_DIR {}: {e}", config.data_dir.display()))
        })?;
        let db = db::connect(&config.database_url.0).await?;
        db::migrate(&db).await?;
        processes::set_gone_after(config.process_gone_after.as_millis() as i64);
        if let Some(host) = &config.host {
            processes::set_host(host.clone());
        }
        processes::set_address(
            config
                .internal_url
                .clone()
                .unwrap_or_else(|| format!("http://{}", config.listen)),
        );
        let operator_token = auth::ensure_operator(&db, &config.data_dir)
            .await
            .map_err(|e| StartError::Bootstrap(e.message))?;
        let built = providers::build(&config)
            .await
            .map_err(StartError::Provider)?;
        if let Some(provider) = &built.provider
            && let Err(e) = provider.recover().await
        {
            tracing::warn!(error = %e, "sandbox.recover_failed");
        }
        let master_key =
            keyfile::load_or_create(config.content_key.as_ref(), &config.data_dir, "content.key")
                .map_err(StartError::Bootstrap)?;
        let keep = config.keep_revisions as usize;
        let arbiter = Arbiter::new();
        let (homes, reconciler): (Arc<dyn HomeStore>, _) = match &config.object_storage {
            Some(cfg) if config.role.worker() => {
                let store = Arc::new(
                    deployment::open_store(&db, cfg, &config.data_dir, keep)
                        .await
                        .map_err(StartError::Bootstrap)?,
                );
                let (db, reconciled) = (db.clone(), store.clone());
                let addr = Reconciler::start_in_arbiter(&arbiter.handle(), move |_| {
                    Reconciler::new(db, reconciled, RECONCILE_EVERY, ORPHAN_GRACE)
                });
                (store, Some(addr))
            }
            Some(cfg) => (
                Arc::new(
                    deployment::open_store(&db, cfg, &config.data_dir, keep)
                        .await
                        .map_err(StartError::Bootstrap)?,
                ) as Arc<dyn HomeStore>,
                None,
            ),
            None => (
                Arc::new(LocalHomeStore::new(
                    &config.data_dir,
                    keep,
                    Limits::default(),
                )),
                None,
            ),
        };
        let internal_token = keyfile::load_or_create(
            config.internal_token.as_ref(),
            &config.data_dir,
            INTERNAL_TOKEN_FILE,
        )
        .map(|k| crate::config::Secret(hex::encode(k)))
        .map_err(StartError::Bootstrap)?;
        let forward = Arc::new(crate::forward::HttpForward::new(
            internal_token.clone(),
            config.command_timeout,
        ));
        let runtime = Arc::new(Runtime {
            db: db.clone(),
            provider: built.provider,
            homes,
            events: EventBus::new(),
            settings: Settings {
                idle: config.idle,
                max_active: config.max_active,
                maintenance_heartbeat_timeout: config.maintenance_heartbeat_timeout,
                command_timeout: config.command_timeout,
                team_screen_limit: config.team_screen_limit,
                provider_setup_error: built.status.setup_error.clone(),
            },
            master_key,
            forward: Some(forward),
            clock: rakazo_actors::clock::Clock::system(),
        });
        // Before anything publishes or watches: events of the other processes.
        let relayed = crate::notify::start(&db, &runtime.events)
            .await
            .map_err(StartError::Bootstrap)?;
        // Before anything publishes: state changes go to the computers' timelines.
        rakazo_actors::timeline::start_journal(db.clone(), &runtime.events);
        crate::recordings::spawn_retention(
            db.clone(),
            config.recording_retention_days,
            runtime.clock.clone(),
        );
        // Before anything uses a home: settle what a crashed process left behind.
        let process = recovery::at_start(&runtime, &config.data_dir)
            .await
            .map_err(|e| StartError::Bootstrap(e.message))?;
        arbiter.spawn(recovery::heartbeat(db.clone()));
        let screen_key = keyfile::load_or_create(
            config.screen_secret.as_ref(),
            &config.data_dir,
            "screen-capability.key",
        )
        .map_err(StartError::Bootstrap)?;
        let keyring = Arc::new(Keyring::new(1, &screen_key));
        let gateway = GatewayActor::start_default();
        let routes: Arc<RouteBook> = Arc::default();
        crate::screens::spawn_revocation_watch(
            &runtime.events,
            crate::screens::Watch {
                db: db.clone(),
                gateway: gateway.clone(),
                routes: routes.clone(),
                provider: runtime.provider.clone(),
            },
        );
        let revoker = Arc::new(GatewayRevoker::new(
            gateway.clone(),
            routes.clone(),
            runtime.events.clone(),
        ));
        if let Some(freezes) = runtime.provider.as_ref().and_then(|p| p.desktop_freezes()) {
            crate::screens::follow_desktop_freezes(db.clone(), runtime.events.clone(), freezes);
        }
        let registry = Arc::new(Registry::new(runtime, arbiter.handle(), revoker));
        let reconciled = registry.clone();
        let every = config.reconcile_interval;
        let computer_reconciler = config.role.worker().then(|| {
            ComputerReconciler::start_in_arbiter(&arbiter.handle(), move |_| {
                ComputerReconciler::new(reconciled, every)
            })
        });
        rakazo_actors::maintenance_job::listen(
            registry.clone(),
            &arbiter.handle(),
            config.role.worker(),
        );
        let elsewhere = Arc::new(crate::screens::Elsewhere::new(internal_token.clone()));
        let authority = Arc::new(ScreenAuthority::new(
            registry.clone(),
            routes.clone(),
            elsewhere.clone(),
            keyring.clone(),
        ));
        let proxy = ProxyState::new(
            keyring.clone(),
            authority.clone(),
            gateway.clone(),
            ProxyConfig {
                novnc_dir: config.novnc_dir.clone(),
                ..ProxyConfig::default()
            },
        );
        let screens = Screens::new(keyring, gateway, routes, elsewhere);
        let recorder = crate::recordings::Recorder::new(
            config.recording_retention_days,
            config.recording_max_run_bytes,
        );
        let recording = config.record_control_sessions.then(|| {
            crate::recordings::control::ControlRecorder::new(
                db.clone(),
                registry.clone(),
                recorder.clone(),
                crate::recordings::control::SAMPLE_EVERY,
            )
        });
        let session_notes = Arc::new(crate::screens::TimelineNotes {
            db: db.clone(),
            recording,
        });
        proxy.set_session_notes(session_notes.clone());
        let app = App {
            config,
            db,
            registry,
            provider_status: built.status,
            fake: built.fake,
            e2b_emulator: built.e2b_emulator,
            emulator_api: built.emulator_api,
            screens,
            tools: Default::default(),
            recorder,
            mcp: Default::default(),
            proxy,
            session_notes,
            authority,
            internal_token,
            reconciler,
            _process: process,
            computer_reconciler,
            relayed,
            _arbiter: arbiter,
        };
        let app = Arc::new(app);
        actix_rt::spawn(crate::api::mcp::sweep(Arc::downgrade(&app)));
        Ok((app, operator_token))
    }

    /// Shared actor dependencies.
    pub fn runtime(&self) -> &Arc<Runtime> {
        self.registry.runtime()
    }

    /// Drains the app once the server stopped taking requests: every computer with a machine
    /// in this process gets a last checkpoint (which stores nothing when the workspace is
    /// unchanged), then the provider stops what must not outlive this process (host
    /// desktops); machines that can outlive it (containers) keep running for the next start
    /// or another process, which may claim them at once: this process's claims and
    /// reservations are released last.
    pub async fn shutdown(&self) {
        let started = std::time::Instant::now();
        let saves = self
            .registry
            .handles()
            .into_iter()
            .map(|handle| async move {
                let save = handle.computer.send(SaveWorkspace(Reason::Shutdown));
                match tokio::time::timeout(SHUTDOWN_CHECKPOINT_TIMEOUT, save).await {
                    Ok(Ok(Ok(Some(_)))) => 1,
                    Ok(Ok(Ok(None))) => 0,
                    Ok(Ok(Err(e))) => {
                        tracing::warn!(code = ?e.code, "server.shutdown.checkpoint_failed");
                        0
                    }
                    Ok(Err(_)) | Err(_) => {
                        tracing::warn!("server.shutdown.checkpoint_failed");
                        0
                    }
                }
            });
        let checkpoints: u32 = futures_util::future::join_all(saves)
            .await
            .into_iter()
            .sum();
        if let Some(provider) = &self.runtime().provider {
            match tokio::time::timeout(SHUTDOWN_PROVIDER_TIMEOUT, provider.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "server.shutdown.provider_failed"),
                Err(_) => tracing::warn!("server.shutdown.provider_timed_out"),
            }
        }
        // Nothing here holds a machine any more: another process may take this one's
        // computers (and its reservations are void) at once, not after its heartbeat goes
        // silent.
        let me = rakazo_actors::processes::id();
        if let Err(e) = rakazo_actors::processes::Processes::new(self.db.clone())
            .gone(me)
            .await
        {
            tracing::warn!(error = %e, "server.shutdown.claims_release_failed");
        }
        tracing::info!(
            checkpoints,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "server.drained"
        );
    }
}

/// How long the last checkpoints at shutdown may take (they run at once, one per computer).
const SHUTDOWN_CHECKPOINT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
/// How long the provider gets to stop its host processes at shutdown.
const SHUTDOWN_PROVIDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Drop for App {
    fn drop(&mut self) {
        self._arbiter.stop();
    }
}
