//! Where live sockets stand, for a proxy in a process that hears no revocation (`rakazo
//! screen-proxy`): every half second it sends the scopes of its live sockets to the API
//! (`POST {api}/internal/screen-standing`) and closes those whose slot was retired or whose
//! control grant ended, and keeps a renewed control grant's sockets open to its new expiry.
//! The API answers from its lease and screen tables, as its own sweep does.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use serde::{Deserialize, Serialize};

use crate::authority::{Authority, AuthorityError, AuthorityRequest};
use crate::capability::Policy;
use crate::gateway::{
    ExtendControl, GatewayActor, ListScopes, RevokeControl, RevokeSlot, SocketScope,
};

/// The internal RPC path of [`Authority::standing`] over HTTP.
pub const STANDING_RPC_PATH: &str = "internal/screen-standing";
/// Most scopes one request carries.
pub const MAX_SCOPES: usize = 500;
/// How often a proxy in its own process asks.
pub const STANDING_EVERY: Duration = Duration::from_millis(500);

/// Where one socket's capability stands now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "standing")]
pub enum Standing {
    /// Still granted; a control grant's expiry as renewed (unix ms).
    #[serde(rename_all = "camelCase")]
    Holds {
        /// The live control grant's expiry.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at_ms: Option<u64>,
    },
    /// Its slot was torn down or reused.
    SlotRetired,
    /// Its control grant ended.
    ControlEnded,
    /// Not known now (the API could not read its tables): nothing is closed.
    Unknown,
}

/// The JSON body of `POST {api}/internal/screen-standing`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandingRequest {
    /// The live sockets' capability fields (at most [`MAX_SCOPES`]).
    pub scopes: Vec<AuthorityRequest>,
}

impl StandingRequest {
    /// The request for `scopes`.
    pub fn of(scopes: &[SocketScope]) -> Self {
        let scopes = scopes
            .iter()
            .map(|s| AuthorityRequest {
                computer_id: s.computer_id.clone(),
                bot_id: s.bot_id.clone(),
                slot: s.slot,
                generation: s.generation,
                policy: s.policy,
                fence: s.fence,
                expires_at_ms: s.expires_at_ms,
                channel: Default::default(),
            })
            .collect();
        Self { scopes }
    }
}

/// The JSON body of its answer: one standing per scope, in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StandingResponse {
    /// Where each scope stands.
    pub standing: Vec<Standing>,
}

/// Asks `authority` every `every` where the live sockets of `gateway` stand and closes or
/// extends them as it answers; ends with the gateway, or at once when the authority does not
/// answer standings (its process hears revocations itself).
pub fn spawn_standing_sweep(
    gateway: Addr<GatewayActor>,
    authority: Arc<dyn Authority>,
    every: Duration,
) {
    actix_rt::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Ok(scopes) = gateway.send(ListScopes).await else {
                return;
            };
            for chunk in scopes.chunks(MAX_SCOPES) {
                let standing = match authority.standing(chunk).await {
                    None => return,
                    Some(Ok(standing)) => standing,
                    Some(Err(e)) => {
                        tracing::warn!(event = "screen.standing.failed", error = %e);
                        break;
                    }
                };
                for (scope, standing) in chunk.iter().zip(standing) {
                    apply(&gateway, scope, standing);
                }
            }
        }
    });
}

/// Tells the gateway what a scope's standing means for its sockets.
fn apply(gateway: &Addr<GatewayActor>, scope: &SocketScope, standing: Standing) {
    match standing {
        Standing::SlotRetired => gateway.do_send(RevokeSlot {
            computer_id: scope.computer_id.clone(),
            slot: scope.slot,
            generation: scope.generation,
        }),
        Standing::ControlEnded if scope.policy == Policy::Control => {
            gateway.do_send(RevokeControl {
                computer_id: scope.computer_id.clone(),
                bot_id: scope.bot_id.clone(),
                fence: scope.fence,
            })
        }
        Standing::Holds {
            expires_at_ms: Some(expires_at_ms),
        } if scope.policy == Policy::Control && expires_at_ms > scope.expires_at_ms => gateway
            .do_send(ExtendControl {
                computer_id: scope.computer_id.clone(),
                bot_id: scope.bot_id.clone(),
                fence: scope.fence,
                expires_at_ms,
            }),
        Standing::Holds { .. } | Standing::ControlEnded | Standing::Unknown => {}
    }
}

/// The standings of an answer to `asked` scopes, or why it is not one.
pub fn read_answer(body: &[u8], asked: usize) -> Result<Vec<Standing>, AuthorityError> {
    let answer: StandingResponse = serde_json::from_slice(body)
        .map_err(|_| AuthorityError::InvalidResponse("malformed_body"))?;
    if answer.standing.len() != asked {
        return Err(AuthorityError::InvalidResponse("standing_count"));
    }
    Ok(answer.standing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standings_read_as_the_api_writes_them() {
        let body = br#"{"standing":[{"standing":"holds"},{"standing":"holds","expiresAtMs":7},
            {"standing":"slotRetired"},{"standing":"controlEnded"},{"standing":"unknown"}]}"#;
        assert_eq!(
            read_answer(body, 5).unwrap(),
            vec![
                Standing::Holds {
                    expires_at_ms: None
                },
                Standing::Holds {
                    expires_at_ms: Some(7)
                },
                Standing::SlotRetired,
                Standing::ControlEnded,
                Standing::Unknown,
            ]
        );
        assert!(read_answer(body, 4).is_err());
        assert!(read_answer(b"{}", 0).is_err());
    }
}
