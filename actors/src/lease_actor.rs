//! The `LeaseActor`: one per computer; the mailbox in front of the fenced lease table.
//!
//! The database decides every grant (see [`crate::leases`]); this actor serializes the
//! decisions of its computer inside one process and notices when control grants lapse, so
//! their live screen sockets can be revoked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::clock::now_ms;
use crate::error::DomainResult;
use crate::events::{Revocation, Topic};
use crate::leases::{Grant, LeaseKey, LeaseKind, Leases};
use crate::runtime::Runtime;

/// How often lapsed control grants are looked for.
const EXPIRY_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Grant a lease.
#[derive(Message)]
#[rtype(result = "DomainResult<Grant>")]
pub struct Acquire {
    /// Which lease.
    pub key: LeaseKey,
    /// Who will hold it.
    pub holder: String,
    /// Lifetime unless renewed.
    pub ttl_ms: i64,
}

/// Extend a grant.
#[derive(Message)]
#[rtype(result = "DomainResult<Grant>")]
pub struct Renew {
    /// Which lease.
    pub key: LeaseKey,
    /// The fence presented.
    pub fence: i64,
    /// Only a grant this holder holds (`LEASE_FENCED` otherwise).
    pub holder: Option<String>,
    /// New lifetime from now.
    pub ttl_ms: i64,
}

/// Release a grant.
#[derive(Message)]
#[rtype(result = "DomainResult<()>")]
pub struct Release {
    /// Which lease.
    pub key: LeaseKey,
    /// The fence presented.
    pub fence: i64,
    /// Only a grant this holder holds (`LEASE_FENCED` otherwise).
    pub holder: Option<String>,
}

/// Tells the space's subscribers that a control grant ended (by release, expiry or with its
/// run), and the screen gateway of every process, by a typed revocation, to close its sockets.
pub fn announce_control_end(
    rt: &Runtime,
    space_id: &str,
    computer_id: &str,
    bot_id: &str,
    fence: i64,
    why: &str,
) {
    rt.events.revoke(Revocation::ControlEnded {
        computer_id: computer_id.to_owned(),
        bot_id: bot_id.to_owned(),
        fence,
    });
    rt.events.publish(
        space_id,
        Topic::LeaseChanged,
        serde_json::json!({
            "computerId": computer_id, "botId": bot_id, "kind": "control",
            "fence": fence, "state": why,
        }),
    );
}

/// [`announce_control_end`] of a grant.
pub fn publish_control_ended(rt: &Runtime, space_id: &str, grant: &Grant, why: &str) {
    announce_control_end(
        rt,
        space_id,
        &grant.computer_id,
        &grant.subject,
        grant.fence,
        why,
    );
}

/// One computer's lease mailbox.
pub struct LeaseActor {
    computer_id: String,
    space_id: String,
    rt: Arc<Runtime>,
    leases: Leases,
    /// Control grants handed out here, watched for expiry.
    control: HashMap<String, Grant>,
}

impl LeaseActor {
    /// The lease actor of a computer.
    pub fn new(computer_id: String, space_id: String, rt: Arc<Runtime>) -> Self {
        Self {
            computer_id,
            space_id,
            leases: Leases::new(rt.db.clone()),
            rt,
            control: HashMap::new(),
        }
    }
}

impl LeaseActor {
    /// Watch a control grant for expiry.
    fn watch(&mut self, res: &DomainResult<Grant>) {
        if let Ok(grant) = res
            && grant.kind == LeaseKind::Control
        {
            self.control.insert(grant.subject.clone(), grant.clone());
        }
    }
}

impl Actor for LeaseActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(EXPIRY_CHECK_INTERVAL, |act, ctx| {
            let now = now_ms();
            let lapsed: Vec<Grant> = act.control.values().filter(|g| g.expires_at_ms <= now).cloned().collect();
            for grant in lapsed {
                act.control.remove(&grant.subject);
                let (rt, leases, space) = (act.rt.clone(), act.leases.clone(), act.space_id.clone());
                let key = LeaseKey::control(&act.computer_id, &grant.subject);
                // Marked released here, so exactly one of this actor and the reconciler
                // publishes the end; a database error still publishes (sockets close).
                ctx.spawn(async move {
                    if leases.mark_expired(&key, grant.fence).await.unwrap_or(true) {
                        tracing::info!(event = "lease.expired", computer.id = %key.computer_id, kind = "control", fence = grant.fence);
                        publish_control_ended(&rt, &space, &grant, "expired");
                    }
                }.into_actor(act));
            }
        });
    }
}

impl Handler<Acquire> for LeaseActor {
    type Result = AtomicResponse<Self, DomainResult<Grant>>;

    fn handle(&mut self, msg: Acquire, _: &mut Context<Self>) -> Self::Result {
        let leases = self.leases.clone();
        AtomicResponse::new(Box::pin(
            async move { leases.acquire(&msg.key, &msg.holder, msg.ttl_ms).await }
                .into_actor(self)
                .map(|res, act, _| {
                    act.watch(&res);
                    res
                }),
        ))
    }
}

impl Handler<Renew> for LeaseActor {
    type Result = AtomicResponse<Self, DomainResult<Grant>>;

    fn handle(&mut self, msg: Renew, _: &mut Context<Self>) -> Self::Result {
        let leases = self.leases.clone();
        AtomicResponse::new(Box::pin(
            async move {
                let holder = msg.holder.as_deref();
                leases
                    .renew_held(&msg.key, msg.fence, holder, msg.ttl_ms)
                    .await
            }
            .into_actor(self)
            .map(|res, act, _| {
                act.watch(&res);
                res
            }),
        ))
    }
}

impl Handler<Release> for LeaseActor {
    type Result = AtomicResponse<Self, DomainResult<()>>;

    fn handle(&mut self, msg: Release, _: &mut Context<Self>) -> Self::Result {
        let leases = self.leases.clone();
        let (key, fence) = (msg.key.clone(), msg.fence);
        AtomicResponse::new(Box::pin(
            async move {
                let holder = msg.holder.as_deref();
                leases.release_held(&msg.key, msg.fence, holder).await
            }
            .into_actor(self)
            .map(move |res, act, _| {
                // Published whichever process handed the grant out: the sockets it
                // guards may be held through any process.
                if res.is_ok() && key.kind == LeaseKind::Control {
                    act.control.remove(&key.subject);
                    announce_control_end(
                        &act.rt,
                        &act.space_id,
                        &key.computer_id,
                        &key.subject,
                        fence,
                        "released",
                    );
                }
                res
            }),
        ))
    }
}
