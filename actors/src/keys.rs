//! Workspace keys: a random data key per computer, wrapped by its space's content key, which
//! is wrapped by the deployment's master key. Deleting a computer row deletes its only
//! wrapped data key, so its stored archives become unreadable.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use rand::RngCore;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};

use crate::entity::{computer, space};
use crate::error::{DomainError, DomainResult, ErrorCode};

/// A 256-bit key.
pub type KeyBytes = [u8; 32];

/// A fresh random key.
pub fn random_key() -> KeyBytes {
    let mut k = [0u8; 32];
    rand::rng().fill_bytes(&mut k);
    k
}

/// Wrap `key` under `kek` for `purpose` (bound as associated data).
pub fn wrap(kek: &KeyBytes, key: &KeyBytes, purpose: &str) -> Vec<u8> {
    let mut nonce = [0u8; 12];
    rand::rng().fill_bytes(&mut nonce);
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(kek));
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: key,
                aad: purpose.as_bytes(),
            },
        )
        .expect("wrapping 32 bytes cannot fail");
    [nonce.as_slice(), &sealed].concat()
}

/// Unwrap a key wrapped by [`wrap`] for the same `purpose`.
pub fn unwrap(kek: &KeyBytes, wrapped: &[u8], purpose: &str) -> DomainResult<KeyBytes> {
    let fail = || {
        DomainError::new(
            ErrorCode::Internal,
            "a stored key does not open with this deployment's key",
        )
    };
    if wrapped.len() != 12 + 32 + 16 {
        return Err(fail());
    }
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(kek));
    let plain = cipher
        .decrypt(
            Nonce::from_slice(&wrapped[..12]),
            Payload {
                msg: &wrapped[12..],
                aad: purpose.as_bytes(),
            },
        )
        .map_err(|_| fail())?;
    plain.try_into().map_err(|_| fail())
}

/// The data key of a computer's workspace, created (and wrapped) on first need.
pub async fn data_key(
    db: &DatabaseConnection,
    master: &KeyBytes,
    computer_id: &str,
) -> DomainResult<KeyBytes> {
    let row = computer::Entity::find_by_id(computer_id)
        .one(db)
        .await?
        .ok_or_else(|| DomainError::not_found("computer"))?;
    let content = content_key(db, master, &row.space_id).await?;
    let purpose = format!("rakazo.data-key:{}", row.storage_id);
    if let Some(wrapped) = &row.wrapped_data_key {
        return unwrap(&content, wrapped, &purpose);
    }
    let key = random_key();
    // Only the first writer's key is kept; everyone then reads it back.
    computer::Entity::update_many()
        .col_expr(
            computer::Column::WrappedDataKey,
            Expr::value(wrap(&content, &key, &purpose)),
        )
        .filter(computer::Column::Id.eq(computer_id))
        .filter(computer::Column::WrappedDataKey.is_null())
        .exec(db)
        .await?;
    let row = computer::Entity::find_by_id(computer_id)
        .one(db)
        .await?
        .ok_or_else(|| DomainError::not_found("computer"))?;
    unwrap(
        &content,
        row.wrapped_data_key.as_deref().unwrap_or_default(),
        &purpose,
    )
}

async fn content_key(
    db: &DatabaseConnection,
    master: &KeyBytes,
    space_id: &str,
) -> DomainResult<KeyBytes> {
    let purpose = format!("rakazo.content-key:{space_id}");
    let find = || space::Entity::find_by_id(space_id).one(db);
    let row = find()
        .await?
        .ok_or_else(|| DomainError::not_found("space"))?;
    if let Some(wrapped) = &row.wrapped_content_key {
        return unwrap(master, wrapped, &purpose);
    }
    space::Entity::update_many()
        .col_expr(
            space::Column::WrappedContentKey,
            Expr::value(wrap(master, &random_key(), &purpose)),
        )
        .filter(space::Column::Id.eq(space_id))
        .filter(space::Column::WrappedContentKey.is_null())
        .exec(db)
        .await?;
    let row = find()
        .await?
        .ok_or_else(|| DomainError::not_found("space"))?;
    unwrap(
        master,
        row.wrapped_content_key.as_deref().unwrap_or_default(),
        &purpose,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_round_trips_and_binds_its_purpose() {
        let (kek, key) = (random_key(), random_key());
        let wrapped = wrap(&kek, &key, "a");
        assert_eq!(unwrap(&kek, &wrapped, "a").unwrap(), key);
        assert!(unwrap(&kek, &wrapped, "b").is_err());
        assert!(unwrap(&random_key(), &wrapped, "a").is_err());
    }
}
