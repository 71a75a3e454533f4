//! Pooled computers: containers created and started before anyone asks, each claimed once by
//! a new computer, so that provisioning skips the container's creation and start.
//!
//! A pooled container is made for one owner (an API process, which starts a spare desktop in
//! it and renews its pool while it runs) with an empty home of its own, `homes/.pool-<hex>`
//! (a name no home key can have). Labels and mounts cannot change once a container exists, so
//! a claim is recorded here instead: the pool home is renamed to `homes/<home key>` (only when
//! that home is missing or empty: nothing of a workspace is ever moved), a link at the old
//! path keeps the mount working across restarts, a claim record under `run/claims/` gives the
//! container its computer's labels, and the container is renamed. Every read of a container
//! ([`Engine::inspect`], [`Engine::find`]) applies the record.
//!
//! Unclaimed containers whose owner stopped renewing (a process that was killed) are removed
//! by [`reap`], with their pool homes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bollard::query_parameters::{ListContainersOptions, RenameContainerOptions};
use serde::{Deserialize, Serialize};

use super::engine::{Engine, EngineError, LABEL_HOME};
use super::wire::{ComputerInfo, CreateComputer};

/// Label: the owner a pooled container was made for.
pub const LABEL_POOL_OWNER: &str = "rakazo.poolOwner";
/// An owner's unclaimed containers outlive its last renewal by this much.
pub const POOL_TTL: Duration = Duration::from_secs(90);
/// How often [`reap`] looks.
pub const REAP_EVERY: Duration = Duration::from_secs(30);
/// Prefix of pool homes and pooled container names' tails.
const POOL_HOME_PREFIX: &str = ".pool-";

/// What the supervisor knows of pools: owners' last renewals and the claims.
pub struct PoolBook {
    owners: Mutex<HashMap<String, Instant>>,
    claims: Mutex<HashMap<String, Claim>>,
    /// One claim or reap at a time: a container is never claimed while it is being removed.
    busy: tokio::sync::Mutex<()>,
    started: Instant,
    dir: PathBuf,
}

/// A claimed container's computer, kept in `run/claims/<container id>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// The claiming computer.
    pub computer_id: String,
    /// Its space.
    pub space_id: String,
    /// Its bot (Private Computers).
    pub bot_id: String,
    /// Its home key: the pool home now is `homes/<home key>`.
    pub home_key: String,
    /// The pool home's key (`.pool-<hex>`), a link to the home once claimed.
    pub pool_key: String,
    /// The container's name once claimed.
    pub name: String,
}

impl PoolBook {
    /// The book of `data_dir`, with the claims recorded there.
    pub fn load(data_dir: &Path) -> Self {
        let dir = data_dir.join("run").join("claims");
        let mut claims = HashMap::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_suffix(".json") else {
                    continue;
                };
                match std::fs::read(entry.path())
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Claim>(&b).ok())
                {
                    Some(claim) => {
                        claims.insert(id.to_string(), claim);
                    }
                    None => tracing::warn!("supervisor.pool.claim_unreadable"),
                }
            }
        }
        Self {
            owners: Mutex::new(HashMap::new()),
            claims: Mutex::new(claims),
            busy: tokio::sync::Mutex::new(()),
            started: Instant::now(),
            dir,
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Claim>> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The claim of container `id`, if it was claimed.
    pub fn claim_of(&self, id: &str) -> Option<Claim> {
        self.claims().get(id).cloned()
    }

    /// The claimed container holding `home_key`, if any.
    pub fn claimed_home(&self, home_key: &str) -> Option<String> {
        self.claims()
            .iter()
            .find(|(_, c)| c.home_key == home_key)
            .map(|(id, _)| id.clone())
    }

    /// `owner` is alive now.
    pub fn renew(&self, owner: &str) {
        self.owners().insert(owner.to_string(), Instant::now());
    }

    /// Whether `owner`'s unclaimed containers are to be removed: its last renewal (or, for an
    /// owner not seen since this supervisor started, the start) is older than `ttl`.
    fn expired(&self, owner: &str, ttl: Duration) -> bool {
        let seen = self.owners().get(owner).copied().unwrap_or(self.started);
        seen.elapsed() > ttl
    }

    fn record(&self, id: &str, claim: &Claim) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".tmp-{id}"));
        std::fs::write(
            &tmp,
            serde_json::to_vec(claim).map_err(std::io::Error::other)?,
        )?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(format!("{id}.json")))?;
        self.claims().insert(id.to_string(), claim.clone());
        Ok(())
    }

    /// Forgets the claim of a removed container.
    pub fn forget(&self, id: &str) -> Option<Claim> {
        let _ = std::fs::remove_file(self.dir.join(format!("{id}.json")));
        self.claims().remove(id)
    }
}

/// Applies `claim` to what the container's own labels say.
pub fn apply(info: &mut ComputerInfo, claim: &Claim, homes: &Path) {
    info.computer_id = claim.computer_id.clone();
    info.space_id = claim.space_id.clone();
    info.bot_id = claim.bot_id.clone();
    info.home_key = claim.home_key.clone();
    info.home_dir = homes.join(&claim.home_key).display().to_string();
}

/// Whether `key` names a pool home.
pub fn is_pool_key(key: &str) -> bool {
    key.strip_prefix(POOL_HOME_PREFIX)
        .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Engine {
    /// `owner` is alive: its unclaimed containers stay. Answers which are running.
    /// The unclaimed pooled containers of `owner` that are still there, for the owner to
    /// forget any that are not (removed behind its back, or with a stopped supervisor).
    pub async fn renew_pool(&self, owner: &str) -> Result<Vec<String>, EngineError> {
        crate::desktop::check_id(owner).map_err(|_| EngineError::Invalid("bad owner".into()))?;
        self.pool().renew(owner);
        let mut filters = HashMap::new();
        filters.insert(
            "label".to_string(),
            vec![format!("{LABEL_POOL_OWNER}={owner}")],
        );
        let found = self
            .docker()
            .list_containers(Some(ListContainersOptions {
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        Ok(found
            .into_iter()
            .filter_map(|c| c.id)
            .filter(|id| self.pool().claim_of(id).is_none())
            .collect())
    }

    /// Creates and starts a pooled container for `owner`. The image must be there already
    /// (a pool never builds one; `ImageMissing` otherwise).
    pub async fn create_pooled(&self, owner: &str) -> Result<ComputerInfo, EngineError> {
        crate::desktop::check_id(owner).map_err(|_| EngineError::Invalid("bad owner".into()))?;
        if !self.image_present().await? {
            return Err(EngineError::ImageMissing(self.settings().image.clone()));
        }
        self.pool().renew(owner);
        let hex = &uuid::Uuid::new_v4().simple().to_string()[..16];
        let key = format!("{POOL_HOME_PREFIX}{hex}");
        let mut labels = HashMap::new();
        labels.insert(LABEL_POOL_OWNER.to_string(), owner.to_string());
        labels.insert(LABEL_HOME.to_string(), key.clone());
        let home = self.homes().join(&key);
        let created = self
            .create_container(&format!("rakazo-pool-{hex}"), labels, home.clone(), None)
            .await;
        match created {
            Ok(info) => {
                tracing::info!(container.name = %info.name, "supervisor.pool.created");
                Ok(info)
            }
            Err(e) => {
                // No container holds the new pool home: it goes (the filler retries often).
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(home)).await;
                Err(e)
            }
        }
    }

    /// Gives the unclaimed pooled container `id` to the computer of `req`: its home becomes
    /// `homes/<home key>` and its name the computer's. `HomeInUse` when that home holds
    /// anything (the caller creates the computer instead; the container stays in the pool).
    pub async fn claim(&self, id: &str, req: &CreateComputer) -> Result<ComputerInfo, EngineError> {
        let name = Self::container_name(req)?;
        if req.account.is_some() {
            return Err(EngineError::Invalid(
                "a pooled computer has no account".into(),
            ));
        }
        let _busy = self.pool().busy.lock().await;
        let (info, owner) = self.inspect_raw(id).await?;
        if owner.is_none() || self.pool().claim_of(&info.id).is_some() {
            return Err(EngineError::Invalid(
                "not an unclaimed pooled computer".into(),
            ));
        }
        if !info.running || !self.pooled_here(&info) {
            return Err(EngineError::Gone);
        }
        self.replace(&name).await?;
        let homes = self.homes();
        let (from, to) = (homes.join(&info.home_key), homes.join(&req.home_key));
        // rename(2) replaces an empty directory and refuses one with anything in it.
        let moved = tokio::task::spawn_blocking(move || std::fs::rename(from, to))
            .await
            .map_err(|e| EngineError::Engine(format!("directory task: {e}")))?;
        match moved {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {
                return Err(EngineError::HomeInUse);
            }
            Err(e) => return Err(EngineError::Engine(format!("pool home: {e}"))),
        }
        let claim = Claim {
            computer_id: req.computer_id.clone(),
            space_id: req.space_id.clone(),
            bot_id: req.bot_id.clone().unwrap_or_default(),
            home_key: req.home_key.clone(),
            pool_key: info.home_key.clone(),
            name,
        };
        self.pool()
            .record(&info.id, &claim)
            .map_err(|e| EngineError::Engine(format!("claim record: {e}")))?;
        self.finish_claim(&info.id, &claim).await?;
        tracing::info!(container.name = %claim.name, "supervisor.pool.claimed");
        self.inspect(&info.id).await
    }

    /// The steps of a recorded claim after the record: the link at the pool home's path and
    /// the container's name. Each is skipped when done, so a claim an earlier supervisor
    /// recorded but did not finish is finished at start.
    async fn finish_claim(&self, id: &str, claim: &Claim) -> Result<(), EngineError> {
        let link = self.homes().join(&claim.pool_key);
        let target = claim.home_key.clone();
        tokio::task::spawn_blocking(move || match std::fs::symlink_metadata(&link) {
            Ok(_) => Ok(()),
            Err(_) => std::os::unix::fs::symlink(target, &link),
        })
        .await
        .map_err(|e| EngineError::Engine(format!("directory task: {e}")))?
        .map_err(|e| EngineError::Engine(format!("pool home link: {e}")))?;
        let (info, _) = self.inspect_raw(id).await?;
        if info.name != claim.name {
            self.docker()
                .rename_container(
                    id,
                    RenameContainerOptions {
                        name: claim.name.clone(),
                    },
                )
                .await?;
        }
        Ok(())
    }

    /// Finishes every recorded claim (at start).
    pub async fn finish_claims(&self) {
        let claims: Vec<(String, Claim)> = self
            .pool()
            .claims()
            .iter()
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect();
        for (id, claim) in claims {
            match self.finish_claim(&id, &claim).await {
                Ok(()) => {}
                Err(EngineError::Gone) => {
                    self.pool().forget(&id);
                }
                Err(e) => tracing::warn!(error = %e, "supervisor.pool.claim_unfinished"),
            }
        }
    }

    /// After a removal: a claimed container's record and link go; an unclaimed one's pool
    /// home goes with it (nothing of a workspace was ever in it).
    pub(super) async fn forget_pooled(&self, id: &str, home_key: &str) {
        let homes = self.homes();
        let gone = match self.pool().forget(id) {
            Some(claim) => {
                let link = homes.join(&claim.pool_key);
                Some((link, false))
            }
            None if is_pool_key(home_key) => Some((homes.join(home_key), true)),
            None => None,
        };
        if let Some((path, whole)) = gone {
            let _ = tokio::task::spawn_blocking(move || {
                let is_link = std::fs::symlink_metadata(&path)
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(false);
                if is_link {
                    std::fs::remove_file(&path)
                } else if whole {
                    std::fs::remove_dir_all(&path)
                } else {
                    Ok(())
                }
            })
            .await;
        }
    }

    /// Whether `info` is an unclaimed pooled container of this supervisor: its home is a pool
    /// home under this `DATA_DIR` (several supervisors may share one engine).
    fn pooled_here(&self, info: &ComputerInfo) -> bool {
        is_pool_key(&info.home_key)
            && Path::new(&info.home_dir) == self.homes().join(&info.home_key)
    }

    /// Removes the unclaimed pooled containers of owners not heard from for `ttl`
    /// ([`POOL_TTL`] in the supervisor).
    pub async fn reap_pool(&self, ttl: Duration) -> Result<usize, EngineError> {
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), vec![LABEL_POOL_OWNER.to_string()]);
        let found = self
            .docker()
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        let _busy = self.pool().busy.lock().await;
        let mut removed = 0;
        for c in found {
            let (Some(id), Some(labels)) = (c.id, c.labels) else {
                continue;
            };
            let owner = labels.get(LABEL_POOL_OWNER).cloned().unwrap_or_default();
            if self.pool().claim_of(&id).is_some() || !self.pool().expired(&owner, ttl) {
                continue;
            }
            // Another supervisor's pool on the same engine is not this one's to remove.
            match self.inspect_raw(&id).await {
                Ok((info, _)) if self.pooled_here(&info) => {}
                _ => continue,
            }
            match self.remove(&id).await {
                Ok(()) | Err(EngineError::Gone) => removed += 1,
                Err(e) => tracing::warn!(error = %e, "supervisor.pool.reap_failed"),
            }
        }
        Ok(removed)
    }
}

/// Finishes recorded claims, then removes expired pools every [`REAP_EVERY`], for good.
pub async fn reap(engine: Engine) {
    engine.finish_claims().await;
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        match engine.reap_pool(POOL_TTL).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(containers = n, "supervisor.pool.reaped"),
            Err(e) => tracing::warn!(error = %e, "supervisor.pool.reap_failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_keys_are_no_home_keys() {
        assert!(is_pool_key(".pool-0123abcd"));
        assert!(!is_pool_key(".pool-"));
        assert!(!is_pool_key(".pool-../x"));
        assert!(!is_pool_key("pool-0123"));
        assert!(crate::desktop::check_id(".pool-0123abcd").is_err());
    }

    #[test]
    fn claims_are_kept_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let book = PoolBook::load(dir.path());
        let claim = Claim {
            computer_id: "c1".into(),
            space_id: "s1".into(),
            bot_id: "b1".into(),
            home_key: "b1".into(),
            pool_key: ".pool-00ff".into(),
            name: "rakazo-bot-b1".into(),
        };
        book.record("abc", &claim).unwrap();
        let again = PoolBook::load(dir.path());
        assert_eq!(again.claim_of("abc"), Some(claim));
        assert_eq!(again.claimed_home("b1").as_deref(), Some("abc"));
        again.forget("abc");
        assert_eq!(PoolBook::load(dir.path()).claim_of("abc"), None);
    }

    #[test]
    fn an_owner_expires_after_its_last_renewal() {
        let dir = tempfile::tempdir().unwrap();
        let book = PoolBook::load(dir.path());
        book.renew("p1");
        assert!(!book.expired("p1", POOL_TTL));
        assert!(
            !book.expired("never-seen", POOL_TTL),
            "a supervisor just started waits"
        );
        if let Some(long_ago) = Instant::now().checked_sub(POOL_TTL + Duration::from_secs(1)) {
            book.owners().insert("p1".into(), long_ago);
            assert!(book.expired("p1", POOL_TTL));
        }
    }
}
