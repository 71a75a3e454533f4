//! The in-process [`Authority`]: on every proxied request, the capability's slot generation
//! must be the screen's current one, a control capability's fence the live control lease, the
//! computer running, and its route (screen or terminal) still in the book. The same answer
//! serves a proxy in another process through `POST /internal/screen-authority`. A route that
//! another process holds (it issued the URL: it holds the computer) is asked of that process;
//! when that process is on another host, the socket is relayed through its proxy.

use std::sync::Arc;

use async_trait::async_trait;
use rakazo_actors::computer::CurrentMachine;
use rakazo_actors::entity::screen;
use rakazo_actors::leases::{LeaseKey, Leases};
use rakazo_actors::provider::ScreenPolicy;
use rakazo_actors::registry::Registry;
use rakazo_web_proxy::{
    Authority, AuthorityError, Capability, Channel, Keyring, Policy, RejectCause, Target,
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use super::elsewhere::{Elsewhere, Holder};
use super::{Hop, RouteBook, RouteKey};

/// Answers the screen proxy from the database, the actors and the route book.
pub struct ScreenAuthority {
    registry: Arc<Registry>,
    routes: Arc<RouteBook>,
    elsewhere: Arc<Elsewhere>,
    /// Seals the capability again for a holder's proxy on another host.
    keyring: Arc<Keyring>,
}

impl ScreenAuthority {
    /// An authority over this app's registry and routes, asking the process that holds a
    /// computer through `elsewhere` (and relaying through its proxy, with capabilities sealed
    /// by `keyring`, when that process is on another host).
    pub fn new(
        registry: Arc<Registry>,
        routes: Arc<RouteBook>,
        elsewhere: Arc<Elsewhere>,
        keyring: Arc<Keyring>,
    ) -> Self {
        Self {
            registry,
            routes,
            elsewhere,
            keyring,
        }
    }
}

fn rejected(cause: RejectCause) -> AuthorityError {
    AuthorityError::Rejected(cause)
}

#[async_trait]
impl Authority for ScreenAuthority {
    async fn target(&self, cap: &Capability) -> Result<Target, AuthorityError> {
        self.resolve(cap, Channel::Screen, Hop::First).await
    }

    async fn terminal_target(&self, cap: &Capability) -> Result<Target, AuthorityError> {
        self.resolve(cap, Channel::Terminal, Hop::First).await
    }
}

impl ScreenAuthority {
    /// The checks of every proxied request, then the route of `channel` in the book; a route
    /// this process does not hold is asked of the process holding the computer, on the
    /// [`Hop::First`] hop only.
    pub async fn resolve(
        &self,
        cap: &Capability,
        channel: Channel,
        hop: Hop,
    ) -> Result<Target, AuthorityError> {
        let db = &self.registry.runtime().db;
        let unavailable = |_| AuthorityError::Unavailable("database");
        let row = screen::Entity::find()
            .filter(screen::Column::ComputerId.eq(&cap.computer_id))
            .filter(screen::Column::BotId.eq(&cap.bot_id))
            .one(db)
            .await
            .map_err(unavailable)?
            .ok_or(rejected(RejectCause::NotFound))?;
        // A frozen desktop is the same generation: the viewer's connection thaws it.
        let current = matches!(row.state.as_str(), "active" | "frozen")
            && row.slot == Some(i64::from(cap.slot))
            && row.generation == cap.generation as i64;
        if !current {
            return Err(rejected(RejectCause::StaleGeneration));
        }
        let policy = match cap.policy {
            Policy::View => ScreenPolicy::View,
            Policy::Control => ScreenPolicy::Control,
        };
        if policy == ScreenPolicy::Control {
            let live = Leases::new(db.clone())
                .live(&LeaseKey::control(&cap.computer_id, &cap.bot_id))
                .await
                .map_err(|_| AuthorityError::Unavailable("database"))?;
            if live.is_none_or(|g| g.fence != cap.fence as i64) {
                return Err(rejected(RejectCause::LeaseEnded));
            }
        }
        let key = RouteKey {
            computer_id: cap.computer_id.clone(),
            bot_id: cap.bot_id.clone(),
            slot: u32::from(cap.slot),
            generation: cap.generation as i64,
            policy,
            fence: cap.fence as i64,
            channel,
        };
        let Some(entry) = self.routes.get(&key).map(|e| e.clone()) else {
            if hop == Hop::First
                && let Ok(Holder::Elsewhere { address, same_host }) =
                    Elsewhere::holder(db, &cap.computer_id).await
            {
                // The holder runs every check and names its gateway.
                let target = self.elsewhere.resolve(&address, cap, channel).await?;
                if same_host {
                    return Ok(target);
                }
                // That gateway is on the holder's own loopback: the socket goes through the
                // holder's proxy, which opens the capability and checks it again.
                let sealed = self
                    .keyring
                    .seal(cap)
                    .map_err(|_| AuthorityError::Unavailable("seal"))?;
                return Ok(Target::through_proxy(
                    &address,
                    &sealed,
                    channel,
                    target.policy(),
                )?);
            }
            return Err(rejected(RejectCause::Revoked));
        };
        let computer = rakazo_actors::entity::computer::Entity::find_by_id(&cap.computer_id)
            .one(db)
            .await
            .map_err(unavailable)?
            .ok_or(rejected(RejectCause::NotFound))?;
        let handle = self.registry.computer(&computer.id, &computer.space_id);
        let running = handle.computer.send(CurrentMachine).await.ok().flatten();
        if running.as_ref() != Some(&entry.machine) {
            return Err(rejected(RejectCause::NotFound));
        }
        Ok(Target::new(
            &entry.route.upstream,
            &entry.route.token,
            cap.policy,
        )?)
    }
}
