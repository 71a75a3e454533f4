//! Bearer tokens: creation, hashing, lookup, and the operator token made at first start.

use std::path::Path;

use base64::Engine;
use rakazo_actors::clock::{new_id, now_ms};
use rakazo_actors::entity::{api_token, bot, user};
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use rand::RngCore;
use sea_orm::{ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set};
use sha2::{Digest, Sha256};

/// Prefix of every token, so leaked ones are easy to recognize and revoke.
const TOKEN_PREFIX: &str = "rkz_";
/// File under `DATA_DIR` holding the operator token.
pub const OPERATOR_TOKEN_FILE: &str = "operator-token";

/// What a token may reach. A caller is exactly one of these; every RPC method names the
/// scopes it admits (`api::methods::METHODS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every space, and the operator methods.
    Operator,
    /// The spaces the user is a member of.
    User,
    /// One bot: its runs, tools, screen view, files, activity and events. Never its issuer's
    /// rights.
    Bot {
        /// The bot.
        bot_id: String,
        /// Its space.
        space_id: String,
    },
}

/// The kind of a [`Scope`], without its bot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeKind {
    /// [`Scope::Operator`].
    Operator,
    /// [`Scope::User`].
    User,
    /// [`Scope::Bot`].
    Bot,
}

/// Who is calling.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The user (for a bot token, the user who minted it: a holder name, not a right).
    pub user_id: String,
    /// What the token reaches.
    pub scope: Scope,
}

impl Caller {
    /// The kind of its scope.
    pub fn kind(&self) -> ScopeKind {
        match self.scope {
            Scope::Operator => ScopeKind::Operator,
            Scope::User => ScopeKind::User,
            Scope::Bot { .. } => ScopeKind::Bot,
        }
    }

    /// Whether the caller is an operator.
    pub fn is_operator(&self) -> bool {
        self.scope == Scope::Operator
    }

    /// The bot of a bot-scoped caller.
    pub fn bot_id(&self) -> Option<&str> {
        match &self.scope {
            Scope::Bot { bot_id, .. } => Some(bot_id),
            _ => None,
        }
    }
}

fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token.
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// Store a new token for `user_id` and return it (the only time it is seen).
pub async fn issue(
    db: &DatabaseConnection,
    user_id: &str,
    label: &str,
    bot_id: Option<String>,
) -> DomainResult<String> {
    let token = generate();
    api_token::ActiveModel {
        id: Set(new_id()),
        user_id: Set(user_id.into()),
        token_hash: Set(hash(&token)),
        label: Set(label.into()),
        bot_id: Set(bot_id),
        created_at_ms: Set(now_ms()),
        revoked_at_ms: Set(None),
    }
    .insert(db)
    .await?;
    Ok(token)
}

/// Create a user.
pub async fn create_user(
    db: &DatabaseConnection,
    name: &str,
    is_operator: bool,
) -> DomainResult<user::Model> {
    Ok(user::ActiveModel {
        id: Set(new_id()),
        name: Set(name.into()),
        email: Set(None),
        is_operator: Set(is_operator),
        created_at_ms: Set(now_ms()),
    }
    .insert(db)
    .await?)
}

/// Resolve a bearer token.
pub async fn authenticate(db: &DatabaseConnection, token: &str) -> DomainResult<Caller> {
    let unauthorized =
        || DomainError::new(ErrorCode::Unauthorized, "a valid bearer token is required");
    if !token.starts_with(TOKEN_PREFIX) {
        return Err(unauthorized());
    }
    let row = api_token::Entity::find()
        .filter(api_token::Column::TokenHash.eq(hash(token)))
        .filter(api_token::Column::RevokedAtMs.is_null())
        .one(db)
        .await?
        .ok_or_else(unauthorized)?;
    let user = user::Entity::find_by_id(&row.user_id)
        .one(db)
        .await?
        .ok_or_else(unauthorized)?;
    // A bot token is the bot's scope only: the issuer's operator flag and memberships do not
    // pass on.
    let scope = match row.bot_id {
        Some(bot_id) => {
            let found = bot::Entity::find_by_id(&bot_id)
                .one(db)
                .await?
                .ok_or_else(unauthorized)?;
            Scope::Bot {
                bot_id,
                space_id: found.space_id,
            }
        }
        None if user.is_operator => Scope::Operator,
        None => Scope::User,
    };
    Ok(Caller {
        user_id: user.id,
        scope,
    })
}

/// Make the operator and its token at first start; returns the token when it was just made.
pub async fn ensure_operator(
    db: &DatabaseConnection,
    data_dir: &Path,
) -> DomainResult<Option<String>> {
    let exists = user::Entity::find()
        .filter(user::Column::IsOperator.eq(true))
        .one(db)
        .await?;
    if exists.is_some() {
        return Ok(None);
    }
    let operator = create_user(db, "operator", true).await?;
    let token = issue(db, &operator.id, "operator", None).await?;
    let path = data_dir.join(OPERATOR_TOKEN_FILE);
    write_private(&path, &token).map_err(|e| {
        DomainError::new(
            ErrorCode::Internal,
            format!("write {}: {e}", path.display()),
        )
    })?;
    Ok(Some(token))
}

/// Write a file readable by its owner only.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.write_all(b"\n")
}
