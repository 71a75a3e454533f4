//! The deployment's identity: a random id made once and kept in its database, which names the
//! deployment's root in a shared bucket (`[OBJECT_STORAGE_PREFIX/]<deployment id>`), so two
//! databases sharing a bucket never see, and never delete, each other's objects; and the
//! opening of the object store at that root.

use std::collections::HashSet;

use object_store::path::Path;
use rakazo_actors::clock::now_ms;
use rakazo_actors::entity::{computer, deployment_setting, home_revision};
use sea_orm::sea_query::{BinOper, Expr, ExprTrait, OnConflict};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QuerySelect,
    Set,
};

use super::archive::Limits;
use super::bucket;
use super::object::ObjectHomeStore;
use crate::config::ObjectStorage;

/// Opens this deployment's object store: rooted at its deployment id under the configured
/// prefix, with the homes its computers stored in the old layout moved under the root (and
/// their recorded locations with them). The error names no key, endpoint or credential.
pub async fn open_store(
    db: &DatabaseConnection,
    cfg: &ObjectStorage,
    data_dir: &std::path::Path,
    keep: usize,
) -> Result<ObjectHomeStore, String> {
    let client = bucket::open(cfg).map_err(|e| e.to_string())?;
    let database = |e: DbErr| format!("database: {e}");
    let id = deployment_id(db).await.map_err(database)?;
    let store = ObjectHomeStore::new(
        client,
        root(cfg.prefix.as_deref(), &id),
        data_dir,
        keep,
        Limits::default(),
    );
    let owned: HashSet<String> = computer::Entity::find()
        .select_only()
        .column(computer::Column::StorageId)
        .into_tuple::<String>()
        .all(db)
        .await
        .map_err(database)?
        .into_iter()
        .collect();
    store
        .adopt_legacy(&owned)
        .await
        .map_err(|e| format!("moving stored homes: {e}"))?;
    relocate_revision_rows(db, store.root())
        .await
        .map_err(database)?;
    tracing::info!(event = "home.store_opened", deployment.id = %id);
    Ok(store)
}

/// This deployment's object store as it is, for reading only: rooted at the deployment id
/// the database already has (none yet: nothing was stored under a root), with nothing moved.
pub async fn open_store_read_only(
    db: &DatabaseConnection,
    cfg: &ObjectStorage,
    data_dir: &std::path::Path,
    keep: usize,
) -> Result<ObjectHomeStore, String> {
    let client = bucket::open(cfg).map_err(|e| e.to_string())?;
    let id = deployment_setting::Entity::find_by_id(DEPLOYMENT_ID)
        .one(db)
        .await
        .map_err(|e| format!("database: {e}"))?
        .map(|row| row.value)
        .ok_or(
            "this database has no deployment id yet: `rakazo serve` makes it at its first start",
        )?;
    Ok(ObjectHomeStore::new(
        client,
        root(cfg.prefix.as_deref(), &id),
        data_dir,
        keep,
        Limits::default(),
    ))
}

/// The setting holding the deployment id.
const DEPLOYMENT_ID: &str = "deployment_id";

/// This database's deployment id, made on first use (concurrent first uses agree: the first
/// insert wins and everyone reads it back).
pub async fn deployment_id(db: &impl ConnectionTrait) -> Result<String, DbErr> {
    deployment_setting::Entity::insert(deployment_setting::ActiveModel {
        name: Set(DEPLOYMENT_ID.into()),
        value: Set(uuid::Uuid::new_v4().simple().to_string()),
        created_at_ms: Set(now_ms()),
    })
    .on_conflict(
        OnConflict::column(deployment_setting::Column::Name)
            .do_nothing()
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    deployment_setting::Entity::find_by_id(DEPLOYMENT_ID)
        .one(db)
        .await?
        .map(|row| row.value)
        .ok_or_else(|| DbErr::RecordNotFound("deployment id".into()))
}

/// The root of a deployment's keys: `prefix/deployment_id`, or `deployment_id` alone.
pub fn root(prefix: Option<&str>, deployment_id: &str) -> Path {
    let prefix = prefix.map(Path::from).unwrap_or_default();
    Path::from_iter(prefix.parts().chain(Path::from(deployment_id).parts()))
}

/// Records the move of the old layout under `root` in the revision rows: a recorded location
/// `homes/...` becomes `<root>/homes/...`. Returns how many rows changed.
pub async fn relocate_revision_rows(db: &impl ConnectionTrait, root: &Path) -> Result<u64, DbErr> {
    if root.parts_count() == 0 {
        return Ok(0);
    }
    let moved = home_revision::Entity::update_many()
        .col_expr(
            home_revision::Column::ObjectKey,
            // `||` concatenates on SQLite and Postgres alike.
            Expr::val(format!("{root}/")).binary(
                BinOper::Custom("||"),
                Expr::col(home_revision::Column::ObjectKey),
            ),
        )
        .filter(home_revision::Column::ObjectKey.starts_with("homes/"))
        .exec(db)
        .await?;
    Ok(moved.rows_affected)
}

/// Whether `prefix` is usable as `OBJECT_STORAGE_PREFIX`: `/`-separated segments of ASCII
/// letters, digits, `-`, `_` and `.`, none empty, `.` or `..`.
pub fn valid_prefix(prefix: &str) -> bool {
    prefix.len() <= 256
        && prefix.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_prefixes() {
        assert_eq!(root(None, "abc").to_string(), "abc");
        assert_eq!(
            root(Some("team/rakazo"), "abc").to_string(),
            "team/rakazo/abc"
        );
        assert!(valid_prefix("rakazo"));
        assert!(valid_prefix("a/b.c/d-e_f"));
        for bad in ["", "/a", "a/", "a//b", "..", "a/../b", "a b", "a\0b", "ä"] {
            assert!(!valid_prefix(bad), "{bad:?}");
        }
    }
}
