//! Screens of a computer that another process holds: that process issues their URLs and
//! answers their proxy targets, over its internal endpoints (`POST /internal/screen-url` and
//! `POST /internal/screen-authority`, with the internal credential), so a person reaches a
//! bot's screen and terminal through whichever API process they are connected to.
//!
//! A forwarded request carries [`HOP_HEADER`], and a process answers it only from what it holds
//! itself: never a second hop, so two processes that each believe the other holds a computer
//! cannot pass a request back and forth.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rakazo_actors::owners::{Owner, Owners};
use rakazo_actors::provider::ScreenPolicy;
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use rakazo_web_proxy::{Authority, AuthorityError, Capability, Channel, HttpAuthority, Target};
use sea_orm::DatabaseConnection;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::Secret;

pub use rakazo_web_proxy::authority::FORWARDED_HEADER as HOP_HEADER;
/// The issuing endpoint's path.
pub const ISSUE_PATH: &str = "/internal/screen-url";
/// Bound on one forwarded issue (it may open the bot's screen: a display, a browser).
const ISSUE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one forwarded target lookup.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A screen or terminal URL asked of the process holding the computer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IssueRequest {
    /// The computer.
    pub computer_id: String,
    /// Whose screen.
    pub bot_id: String,
    /// View or control (a terminal is always under control).
    pub policy: ScreenPolicy,
    /// The control lease's fence (0 for view).
    pub fence: i64,
    /// When the URL stops working.
    pub expires_at_ms: i64,
    /// The screen or its terminal.
    pub channel: Channel,
}

/// Where a computer's screens are served from.
pub enum Holder {
    /// This process.
    Here,
    /// Another live process.
    Elsewhere {
        /// The base URL of its internal endpoints (and its screen proxy).
        address: String,
        /// Whether its gateways are on a loopback this process reaches
        /// ([`rakazo_actors::processes::shares_loopback`]); if not, its sockets are relayed
        /// through its own proxy.
        same_host: bool,
    },
}

/// The client side: asks the holding process.
pub struct Elsewhere {
    http: reqwest::Client,
    token: Secret,
    /// One authority client per holding process, by address.
    authorities: DashMap<String, Arc<HttpAuthority>>,
}

fn unavailable(why: &str) -> DomainError {
    DomainError::new(ErrorCode::ComputerUnavailable, why)
}

impl Elsewhere {
    /// A client sending `token` (the deployment's internal credential).
    pub fn new(token: Secret) -> Self {
        let http = reqwest::Client::builder()
            .timeout(ISSUE_TIMEOUT)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("http client");
        Self {
            http,
            token,
            authorities: DashMap::new(),
        }
    }

    /// Which process serves `computer_id`'s screens: another live one with an address, or
    /// this one (which then answers from what it holds, or not at all).
    pub async fn holder(db: &DatabaseConnection, computer_id: &str) -> DomainResult<Holder> {
        Ok(match Owners::new(db.clone()).holder(computer_id).await? {
            Some(Owner::Elsewhere {
                address: Some(address),
                host,
                ..
            }) => Holder::Elsewhere {
                address,
                same_host: rakazo_actors::processes::shares_loopback(host.as_deref()),
            },
            _ => Holder::Here,
        })
    }

    /// Asks the process at `address` to issue a URL (its answer is the URL's JSON).
    pub async fn issue<T: DeserializeOwned>(
        &self,
        address: &str,
        request: &IssueRequest,
    ) -> DomainResult<T> {
        let resp = self
            .http
            .post(format!("{address}{ISSUE_PATH}"))
            .bearer_auth(&self.token.0)
            .header(HOP_HEADER, "1")
            .json(request)
            .send()
            .await
            .map_err(|_| unavailable("the process holding the computer did not answer"))?;
        match resp.json::<IssueAnswer<T>>().await {
            Ok(IssueAnswer::Ok(url)) => Ok(url),
            Ok(IssueAnswer::Err { code, message }) => Err(DomainError::new(code, message)),
            Err(_) => Err(unavailable(
                "the process holding the computer answered unreadably",
            )),
        }
    }

    /// Asks the process at `address` for the current target of `cap` on `channel`.
    pub async fn resolve(
        &self,
        address: &str,
        cap: &Capability,
        channel: Channel,
    ) -> Result<Target, AuthorityError> {
        let authority = match self.authorities.get(address) {
            Some(a) => a.clone(),
            None => {
                let a = HttpAuthority::new(address, self.token.0.clone(), RESOLVE_TIMEOUT)
                    .map_err(|_| AuthorityError::Unavailable("holder_address"))?
                    .forwarded();
                let a = Arc::new(a);
                self.authorities.insert(address.to_owned(), a.clone());
                a
            }
        };
        match channel {
            Channel::Screen => authority.target(cap).await,
            Channel::Terminal => authority.terminal_target(cap).await,
        }
    }
}

/// The issuing endpoint's answer: the URL, or the holder's error.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IssueAnswer<T> {
    /// The URL's JSON.
    Ok(T),
    /// Why not.
    Err {
        /// Stable error code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
}
