//! The gateway actor: the registry of live screen and terminal sockets, and their revocation.
//!
//! Every relayed websocket registers here with the scope of its capability and a [`Closer`].
//! When a slot is torn down or reused ([`RevokeSlot`]), a control lease ends
//! ([`RevokeControl`]) or a capability expires (the sweep interval), every affected socket is
//! told to close with reason `revoked`. Revocation replies only after each affected socket has
//! acknowledged (or [`REVOKE_ACK_TIMEOUT`] passed), so a caller that awaits it before reusing a
//! slot knows no old socket is still relaying.
//!
//! The actor also remembers the newest revoked generation per slot and fence per control lease
//! (watermarks), so a socket whose authority check raced with a revocation is refused at
//! [`Register`] instead of slipping through. Generations and fences must only grow.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;
use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};

use crate::capability::{Capability, Policy, now_ms};

/// How often expired sockets are looked for.
pub const EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_millis(250);
/// Longest a revocation waits for sockets to acknowledge their close.
pub const REVOKE_ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// The websocket close reason every revoked socket gets.
pub const REVOKED_CLOSE_REASON: &str = "revoked";

/// What kind of socket is registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SocketKind {
    /// A relayed VNC websocket.
    Screen,
    /// A terminal websocket opened under a control capability.
    Terminal,
}

impl SocketKind {
    /// Stable name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            SocketKind::Screen => "screen",
            SocketKind::Terminal => "terminal",
        }
    }
}

/// The capability fields a live socket is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketScope {
    /// Computer id.
    pub computer_id: String,
    /// Bot id.
    pub bot_id: String,
    /// Screen slot.
    pub slot: u16,
    /// Slot generation.
    pub generation: u64,
    /// View or control.
    pub policy: Policy,
    /// Control lease fence (0 for view).
    pub fence: u64,
    /// Expiry, unix ms.
    pub expires_at_ms: u64,
    /// Screen or terminal.
    pub kind: SocketKind,
}

impl SocketScope {
    /// The scope of a socket opened with `capability`.
    pub fn of(capability: &Capability, kind: SocketKind) -> SocketScope {
        SocketScope {
            computer_id: capability.computer_id.clone(),
            bot_id: capability.bot_id.clone(),
            slot: capability.slot,
            generation: capability.generation,
            policy: capability.policy,
            fence: capability.fence,
            expires_at_ms: capability.expires_at_ms,
            kind,
        }
    }
}

/// Why a socket is being closed by the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevokeCause {
    /// The slot was torn down or reused.
    Slot,
    /// The control lease ended.
    Control,
    /// The capability expired.
    Expired,
}

impl RevokeCause {
    /// Stable name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RevokeCause::Slot => "slot",
            RevokeCause::Control => "control",
            RevokeCause::Expired => "expired",
        }
    }
}

/// Acknowledges a close when dropped: the socket drops it once the browser's side is closed (its
/// upstream is cleaned up after).
#[derive(Debug)]
pub struct CloseAck(Option<oneshot::Sender<()>>);

impl CloseAck {
    fn pair() -> (CloseAck, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (CloseAck(Some(tx)), rx)
    }
}

impl Drop for CloseAck {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Tells one socket to close with reason [`REVOKED_CLOSE_REASON`]. The socket keeps `ack`
/// until it has closed, then drops it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct CloseSocket {
    /// Why.
    pub cause: RevokeCause,
    /// Dropped when the close is done.
    pub ack: CloseAck,
}

/// How the gateway reaches a socket: an actor's recipient, or a channel for task-based relays.
pub enum Closer {
    /// An actor session.
    Recipient(Recipient<CloseSocket>),
    /// A task-based session (the screen relay).
    Channel(mpsc::UnboundedSender<CloseSocket>),
}

impl Closer {
    /// Sends the close; a socket already gone acknowledges at once (the message is dropped).
    fn close(&self, msg: CloseSocket) {
        match self {
            Closer::Recipient(r) => r.do_send(msg),
            Closer::Channel(c) => {
                let _ = c.send(msg);
            }
        }
    }
}

impl From<Recipient<CloseSocket>> for Closer {
    fn from(r: Recipient<CloseSocket>) -> Self {
        Closer::Recipient(r)
    }
}

impl From<mpsc::UnboundedSender<CloseSocket>> for Closer {
    fn from(c: mpsc::UnboundedSender<CloseSocket>) -> Self {
        Closer::Channel(c)
    }
}

/// Identifies one registered socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SocketId(u64);

/// Registers a live socket. Refused when its scope is already revoked or expired.
#[derive(Message)]
#[rtype(result = "Result<SocketId, RegisterError>")]
pub struct Register {
    /// What the socket is bound to.
    pub scope: SocketScope,
    /// The random `screen.connection_id` of the socket, for revocation logs.
    pub connection_id: String,
    /// How to close it.
    pub closer: Closer,
}

/// Why a socket may not register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Its slot generation or control lease was revoked meanwhile.
    #[error("capability revoked")]
    Revoked,
    /// Its capability expired.
    #[error("capability expired")]
    Expired,
}

/// Removes a socket that closed by itself. Unknown ids are ignored.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unregister(pub SocketId);

/// The slot was torn down or is about to be reused: close every socket of `slot` on
/// `computer_id` whose generation is `generation` or older, and refuse them from now on.
#[derive(Message)]
#[rtype(result = "Revoked")]
pub struct RevokeSlot {
    /// Computer id.
    pub computer_id: String,
    /// Screen slot.
    pub slot: u16,
    /// The newest generation being retired.
    pub generation: u64,
}

/// A control lease ended: close every control socket of `bot_id` on `computer_id` whose fence is
/// `fence` or older, and refuse them from now on.
#[derive(Message)]
#[rtype(result = "Revoked")]
pub struct RevokeControl {
    /// Computer id.
    pub computer_id: String,
    /// Bot whose screen the lease was on.
    pub bot_id: String,
    /// The fence of the ended lease.
    pub fence: u64,
}

/// A control lease was renewed: its live control sockets (screen and terminal) stay open until
/// the new expiry. New connections still need a capability that has not expired.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ExtendControl {
    /// Computer id.
    pub computer_id: String,
    /// Bot whose screen the lease is on.
    pub bot_id: String,
    /// The renewed lease's fence (only sockets of exactly this fence are extended).
    pub fence: u64,
    /// The new expiry, unix ms.
    pub expires_at_ms: u64,
}

/// Forget watermarks of a destroyed computer (and close any socket still on it).
#[derive(Message)]
#[rtype(result = "Revoked")]
pub struct ForgetComputer {
    /// Computer id.
    pub computer_id: String,
}

/// Number of live sockets (tests, metrics).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct CountSockets;

/// The scopes of every live socket, each once (the sweep checks them against the tables).
#[derive(Message)]
#[rtype(result = "Vec<SocketScope>")]
pub struct ListScopes;

/// The answer to a revocation: how many sockets were closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, MessageResponse)]
pub struct Revoked {
    /// Sockets told to close (and acknowledged or timed out).
    pub closed: usize,
}

struct Entry {
    scope: SocketScope,
    connection_id: String,
    closer: Closer,
}

/// The registry of live sockets. Start one per process with [`GatewayActor::start_default`].
pub struct GatewayActor {
    next_id: u64,
    sockets: HashMap<SocketId, Entry>,
    retired_generation: HashMap<(String, u16), u64>,
    ended_fence: HashMap<(String, String), u64>,
    sweep_interval: Duration,
}

impl Default for GatewayActor {
    fn default() -> Self {
        GatewayActor::new(EXPIRY_SWEEP_INTERVAL)
    }
}

impl GatewayActor {
    /// A registry sweeping for expired sockets every `sweep_interval`.
    pub fn new(sweep_interval: Duration) -> GatewayActor {
        GatewayActor {
            next_id: 0,
            sockets: HashMap::new(),
            retired_generation: HashMap::new(),
            ended_fence: HashMap::new(),
            sweep_interval,
        }
    }

    /// Starts the default registry in the current actix system.
    pub fn start_default() -> Addr<GatewayActor> {
        GatewayActor::default().start()
    }

    fn is_revoked(&self, s: &SocketScope) -> bool {
        let slot_key = (s.computer_id.clone(), s.slot);
        if self
            .retired_generation
            .get(&slot_key)
            .is_some_and(|&g| s.generation <= g)
        {
            return true;
        }
        s.policy == Policy::Control
            && self
                .ended_fence
                .get(&(s.computer_id.clone(), s.bot_id.clone()))
                .is_some_and(|&f| s.fence <= f)
    }

    /// Removes every socket matching `affected` and tells it to close; returns the acks.
    fn close_where(
        &mut self,
        cause: RevokeCause,
        affected: impl Fn(&SocketScope) -> bool,
    ) -> Vec<oneshot::Receiver<()>> {
        let ids: Vec<SocketId> = self
            .sockets
            .iter()
            .filter(|(_, e)| affected(&e.scope))
            .map(|(id, _)| *id)
            .collect();
        let mut acks = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(entry) = self.sockets.remove(&id) else {
                continue;
            };
            tracing::event!(
                name: "screen.proxy.revoked",
                tracing::Level::INFO,
                screen.connection_id = %entry.connection_id,
                policy = entry.scope.policy.as_str(),
                kind = entry.scope.kind.as_str(),
                cause = cause.as_str(),
                "screen.proxy.revoked"
            );
            let (ack, rx) = CloseAck::pair();
            entry.closer.close(CloseSocket { cause, ack });
            acks.push(rx);
        }
        acks
    }

    fn sweep_expired(&mut self) {
        let now = now_ms();
        // Nobody awaits the sweep; the sockets still close and acknowledge to nobody.
        drop(self.close_where(RevokeCause::Expired, |s| s.expires_at_ms <= now));
    }
}

fn await_acks(acks: Vec<oneshot::Receiver<()>>) -> ResponseFuture<Revoked> {
    let closed = acks.len();
    Box::pin(async move {
        let _ = tokio::time::timeout(REVOKE_ACK_TIMEOUT, join_all(acks)).await;
        Revoked { closed }
    })
}

impl Actor for GatewayActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.sweep_interval, |act, _| act.sweep_expired());
    }
}

impl Handler<Register> for GatewayActor {
    type Result = Result<SocketId, RegisterError>;

    fn handle(&mut self, msg: Register, _: &mut Self::Context) -> Self::Result {
        if msg.scope.expires_at_ms <= now_ms() {
            return Err(RegisterError::Expired);
        }
        if self.is_revoked(&msg.scope) {
            return Err(RegisterError::Revoked);
        }
        self.next_id += 1;
        let id = SocketId(self.next_id);
        self.sockets.insert(
            id,
            Entry {
                scope: msg.scope,
                connection_id: msg.connection_id,
                closer: msg.closer,
            },
        );
        Ok(id)
    }
}

impl Handler<Unregister> for GatewayActor {
    type Result = ();

    fn handle(&mut self, msg: Unregister, _: &mut Self::Context) {
        self.sockets.remove(&msg.0);
    }
}

impl Handler<RevokeSlot> for GatewayActor {
    type Result = ResponseFuture<Revoked>;

    fn handle(&mut self, msg: RevokeSlot, _: &mut Self::Context) -> Self::Result {
        let watermark = self
            .retired_generation
            .entry((msg.computer_id.clone(), msg.slot))
            .or_insert(msg.generation);
        *watermark = (*watermark).max(msg.generation);
        let acks = self.close_where(RevokeCause::Slot, |s| {
            s.computer_id == msg.computer_id && s.slot == msg.slot && s.generation <= msg.generation
        });
        await_acks(acks)
    }
}

impl Handler<RevokeControl> for GatewayActor {
    type Result = ResponseFuture<Revoked>;

    fn handle(&mut self, msg: RevokeControl, _: &mut Self::Context) -> Self::Result {
        let watermark = self
            .ended_fence
            .entry((msg.computer_id.clone(), msg.bot_id.clone()))
            .or_insert(msg.fence);
        *watermark = (*watermark).max(msg.fence);
        let acks = self.close_where(RevokeCause::Control, |s| {
            s.policy == Policy::Control
                && s.computer_id == msg.computer_id
                && s.bot_id == msg.bot_id
                && s.fence <= msg.fence
        });
        await_acks(acks)
    }
}

impl Handler<ExtendControl> for GatewayActor {
    type Result = usize;

    fn handle(&mut self, msg: ExtendControl, _: &mut Self::Context) -> usize {
        let mut extended = 0;
        for entry in self.sockets.values_mut() {
            let s = &mut entry.scope;
            if s.policy == Policy::Control
                && s.computer_id == msg.computer_id
                && s.bot_id == msg.bot_id
                && s.fence == msg.fence
                && s.expires_at_ms < msg.expires_at_ms
            {
                s.expires_at_ms = msg.expires_at_ms;
                extended += 1;
            }
        }
        extended
    }
}

impl Handler<ForgetComputer> for GatewayActor {
    type Result = ResponseFuture<Revoked>;

    fn handle(&mut self, msg: ForgetComputer, _: &mut Self::Context) -> Self::Result {
        self.retired_generation
            .retain(|(c, _), _| *c != msg.computer_id);
        self.ended_fence.retain(|(c, _), _| *c != msg.computer_id);
        let acks = self.close_where(RevokeCause::Slot, |s| s.computer_id == msg.computer_id);
        await_acks(acks)
    }
}

impl Handler<ListScopes> for GatewayActor {
    type Result = Vec<SocketScope>;

    fn handle(&mut self, _: ListScopes, _: &mut Self::Context) -> Vec<SocketScope> {
        let mut scopes: Vec<SocketScope> = Vec::new();
        for entry in self.sockets.values() {
            if !scopes.contains(&entry.scope) {
                scopes.push(entry.scope.clone());
            }
        }
        scopes
    }
}

impl Handler<CountSockets> for GatewayActor {
    type Result = usize;

    fn handle(&mut self, _: CountSockets, _: &mut Self::Context) -> usize {
        self.sockets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(policy: Policy, slot: u16, generation: u64, fence: u64) -> SocketScope {
        SocketScope {
            computer_id: "c1".into(),
            bot_id: "b1".into(),
            slot,
            generation,
            policy,
            fence,
            expires_at_ms: now_ms() + 60_000,
            kind: SocketKind::Screen,
        }
    }

    async fn register(
        gw: &Addr<GatewayActor>,
        scope: SocketScope,
    ) -> (
        Result<SocketId, RegisterError>,
        mpsc::UnboundedReceiver<CloseSocket>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let r = gw
            .send(Register {
                scope,
                connection_id: "test".into(),
                closer: tx.into(),
            })
            .await
            .unwrap();
        (r, rx)
    }

    #[actix_rt::test]
    async fn revoke_slot_closes_old_generations_and_refuses_them_later() {
        let gw = GatewayActor::start_default();
        let (a, mut a_rx) = register(&gw, scope(Policy::View, 1, 3, 0)).await;
        let (b, mut b_rx) = register(&gw, scope(Policy::Control, 1, 3, 5)).await;
        let (c, mut c_rx) = register(&gw, scope(Policy::View, 2, 3, 0)).await;
        assert!(a.is_ok() && b.is_ok() && c.is_ok());
        // The sockets acknowledge when they drop the message.
        let closer = actix_rt::spawn(async move {
            let m1 = a_rx.recv().await.unwrap();
            let m2 = b_rx.recv().await.unwrap();
            assert_eq!(m1.cause, RevokeCause::Slot);
            assert_eq!(m2.cause, RevokeCause::Slot);
        });
        let revoked = gw
            .send(RevokeSlot {
                computer_id: "c1".into(),
                slot: 1,
                generation: 3,
            })
            .await
            .unwrap();
        assert_eq!(revoked.closed, 2);
        closer.await.unwrap();
        assert!(c_rx.try_recv().is_err());
        assert_eq!(gw.send(CountSockets).await.unwrap(), 1);
        let (late, _) = register(&gw, scope(Policy::View, 1, 3, 0)).await;
        assert_eq!(late, Err(RegisterError::Revoked));
        let (fresh, _) = register(&gw, scope(Policy::View, 1, 4, 0)).await;
        assert!(fresh.is_ok());
    }

    #[actix_rt::test]
    async fn revoke_control_spares_view_and_newer_leases() {
        let gw = GatewayActor::start_default();
        let (_, mut view_rx) = register(&gw, scope(Policy::View, 1, 1, 0)).await;
        let (_, mut old_rx) = register(&gw, scope(Policy::Control, 1, 1, 7)).await;
        let (_, mut new_rx) = register(&gw, scope(Policy::Control, 1, 1, 8)).await;
        let revoke = gw.send(RevokeControl {
            computer_id: "c1".into(),
            bot_id: "b1".into(),
            fence: 7,
        });
        let revoked = revoke.await.unwrap();
        assert_eq!(revoked.closed, 1);
        assert!(old_rx.try_recv().is_ok());
        assert!(view_rx.try_recv().is_err());
        assert!(new_rx.try_recv().is_err());
        let (late, _) = register(&gw, scope(Policy::Control, 1, 1, 7)).await;
        assert_eq!(late, Err(RegisterError::Revoked));
    }

    #[actix_rt::test]
    async fn revocation_waits_for_acknowledgement() {
        let gw = GatewayActor::start_default();
        let (_, mut rx) = register(&gw, scope(Policy::View, 1, 1, 0)).await;
        let holder = actix_rt::spawn(async move {
            let msg = rx.recv().await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(msg);
            std::time::Instant::now()
        });
        let revoked = gw
            .send(RevokeSlot {
                computer_id: "c1".into(),
                slot: 1,
                generation: 1,
            })
            .await
            .unwrap();
        let replied = std::time::Instant::now();
        let acked = holder.await.unwrap();
        assert_eq!(revoked.closed, 1);
        assert!(replied >= acked, "replied before the socket acknowledged");
    }

    #[actix_rt::test]
    async fn expired_sockets_are_swept_and_refused() {
        let gw = GatewayActor::new(Duration::from_millis(20)).start();
        let mut s = scope(Policy::View, 1, 1, 0);
        s.expires_at_ms = now_ms() + 100;
        let (r, mut rx) = register(&gw, s.clone()).await;
        assert!(r.is_ok());
        let msg = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(msg.cause, RevokeCause::Expired);
        let (late, _) = register(&gw, s).await;
        assert_eq!(late, Err(RegisterError::Expired));
    }

    #[actix_rt::test]
    async fn a_renewed_control_lease_keeps_its_sockets_past_the_old_expiry() {
        let gw = GatewayActor::new(Duration::from_millis(20)).start();
        let mut renewed = scope(Policy::Control, 1, 1, 4);
        renewed.expires_at_ms = now_ms() + 150;
        let mut other = renewed.clone();
        other.fence = 3;
        let (_, mut rx) = register(&gw, renewed).await;
        let (_, mut old) = register(&gw, other).await;
        let extended = gw
            .send(ExtendControl {
                computer_id: "c1".into(),
                bot_id: "b1".into(),
                fence: 4,
                expires_at_ms: now_ms() + 60_000,
            })
            .await
            .unwrap();
        assert_eq!(extended, 1);
        // The other fence's socket expires; the renewed one stays.
        let closed = tokio::time::timeout(Duration::from_secs(2), old.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(closed.cause, RevokeCause::Expired);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), rx.recv())
                .await
                .is_err()
        );
    }

    #[actix_rt::test]
    async fn dead_sockets_do_not_block_revocation() {
        let gw = GatewayActor::start_default();
        let (_, rx) = register(&gw, scope(Policy::View, 1, 1, 0)).await;
        drop(rx);
        let revoked = tokio::time::timeout(
            Duration::from_millis(500),
            gw.send(ForgetComputer {
                computer_id: "c1".into(),
            }),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(revoked.closed, 1);
    }
}
