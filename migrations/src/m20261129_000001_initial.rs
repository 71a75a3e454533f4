//! The initial schema: spaces, users, bots, computers, screens, leases, runs and their history.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Column kinds used by the schema; each maps to one portable SQL type.
#[derive(Clone, Copy)]
enum Col {
    /// Text primary key.
    Id,
    /// Required text.
    Text,
    /// Optional text.
    TextNull,
    /// Required 64-bit integer.
    Int,
    /// Optional 64-bit integer.
    IntNull,
    /// Optional binary.
    BlobNull,
    /// Required boolean.
    Bool,
}

fn table(name: &str, cols: &[(&str, Col)]) -> TableCreateStatement {
    let mut t = Table::create();
    t.table(Alias::new(name)).if_not_exists();
    for (col, kind) in cols {
        let mut def = ColumnDef::new(Alias::new(*col));
        match kind {
            Col::Id => def.text().not_null().primary_key(),
            Col::Text => def.text().not_null(),
            Col::TextNull => def.text().null(),
            Col::Int => def.big_integer().not_null(),
            Col::IntNull => def.big_integer().null(),
            Col::BlobNull => def.blob().null(),
            Col::Bool => def.boolean().not_null().default(false),
        };
        t.col(def);
    }
    t.to_owned()
}

fn index(name: &str, table: &str, cols: &[&str], unique: bool) -> IndexCreateStatement {
    let mut i = Index::create();
    i.name(name).table(Alias::new(table)).if_not_exists();
    for c in cols {
        i.col(Alias::new(*c));
    }
    if unique {
        i.unique();
    }
    i.to_owned()
}

fn tables() -> Vec<TableCreateStatement> {
    use Col::*;
    vec![
        table(
            "users",
            &[
                ("id", Id),
                ("name", Text),
                ("email", TextNull),
                ("is_operator", Bool),
                ("created_at_ms", Int),
            ],
        ),
        table(
            "api_tokens",
            &[
                ("id", Id),
                ("user_id", Text),
                ("token_hash", Text),
                ("label", Text),
                ("bot_id", TextNull),
                ("created_at_ms", Int),
                ("revoked_at_ms", IntNull),
            ],
        ),
        table(
            "spaces",
            &[
                ("id", Id),
                ("name", Text),
                ("owner_id", Text),
                ("wrapped_content_key", BlobNull),
                ("created_at_ms", Int),
            ],
        ),
        table(
            "space_members",
            &[
                ("id", Id),
                ("space_id", Text),
                ("user_id", Text),
                ("role", Text),
                ("created_at_ms", Int),
            ],
        ),
        table(
            "bots",
            &[
                ("id", Id),
                ("space_id", Text),
                ("name", Text),
                ("computer_mode", Text),
                ("created_at_ms", Int),
            ],
        ),
        table(
            "computers",
            &[
                ("id", Id),
                ("space_id", Text),
                ("owner_id", Text),
                ("bot_id", TextNull),
                ("kind", Text),
                ("home_key", Text),
                ("provider_kind", TextNull),
                ("provider_ref", TextNull),
                ("state", Text),
                ("revision", Int),
                ("storage_id", Text),
                ("wrapped_data_key", BlobNull),
                ("provisioning_fence", Int),
                ("lease_epoch", Int),
                ("quarantined", Bool),
                ("last_active_at_ms", Int),
                ("created_at_ms", Int),
                ("updated_at_ms", Int),
            ],
        ),
        table(
            "screens",
            &[
                ("id", Id),
                ("computer_id", Text),
                ("bot_id", Text),
                ("slot", IntNull),
                ("generation", Int),
                ("state", Text),
                ("profile_path", Text),
                ("last_used_at_ms", Int),
                ("updated_at_ms", Int),
            ],
        ),
        table(
            "leases",
            &[
                ("id", Id),
                ("computer_id", Text),
                ("kind", Text),
                ("subject", Text),
                ("holder", Text),
                ("fence", Int),
                ("expires_at_ms", Int),
                ("released_at_ms", IntNull),
                ("created_at_ms", Int),
            ],
        ),
        table(
            "runs",
            &[
                ("id", Id),
                ("space_id", Text),
                ("bot_id", Text),
                ("computer_id", Text),
                ("state", Text),
                ("lease_fence", Int),
                ("takeover_requested_at_ms", IntNull),
                ("created_at_ms", Int),
                ("updated_at_ms", Int),
                ("ended_at_ms", IntNull),
            ],
        ),
        table(
            "home_revisions",
            &[
                ("id", Id),
                ("computer_id", Text),
                ("home_key", Text),
                ("revision", Int),
                ("size_bytes", Int),
                ("object_key", TextNull),
                ("reason", Text),
                ("created_at_ms", Int),
            ],
        ),
        table(
            "maintenance_operations",
            &[
                ("id", Id),
                ("computer_id", Text),
                ("kind", Text),
                ("state", Text),
                ("stage", TextNull),
                ("worker_id", TextNull),
                ("heartbeat_at_ms", IntNull),
                ("error", TextNull),
                ("created_at_ms", Int),
                ("updated_at_ms", Int),
            ],
        ),
        table(
            "computer_runs",
            &[
                ("id", Id),
                ("computer_id", Text),
                ("user_id", TextNull),
                ("space_id", TextNull),
                ("kind", Text),
                ("provider_kind", Text),
                ("started_at_ms", Int),
                ("ended_at_ms", IntNull),
                ("end_reason", TextNull),
            ],
        ),
        table(
            "activity_events",
            &[
                ("id", Id),
                ("seq", Int),
                ("space_id", Text),
                ("computer_id", Text),
                ("bot_id", Text),
                ("kind", Text),
                ("tool", Text),
                ("command", Text),
                ("output_tail", TextNull),
                ("size_bytes", IntNull),
                ("error", TextNull),
                ("created_at_ms", Int),
            ],
        ),
    ]
}

fn indexes() -> Vec<IndexCreateStatement> {
    vec![
        index("ux_api_tokens_hash", "api_tokens", &["token_hash"], true),
        index(
            "ux_space_members",
            "space_members",
            &["space_id", "user_id"],
            true,
        ),
        index("ix_bots_space", "bots", &["space_id"], false),
        index("ux_computers_home_key", "computers", &["home_key"], true),
        index("ix_computers_space", "computers", &["space_id"], false),
        index(
            "ux_screens_bot",
            "screens",
            &["computer_id", "bot_id"],
            true,
        ),
        // The fence of one lease key only grows: two grants racing for the same next fence
        // collide here and exactly one wins.
        index(
            "ux_leases_fence",
            "leases",
            &["computer_id", "kind", "subject", "fence"],
            true,
        ),
        index("ix_runs_bot", "runs", &["bot_id", "state"], false),
        index(
            "ux_home_revisions",
            "home_revisions",
            &["computer_id", "revision"],
            true,
        ),
        index(
            "ix_maintenance_computer",
            "maintenance_operations",
            &["computer_id", "state"],
            false,
        ),
        index(
            "ix_computer_runs_computer",
            "computer_runs",
            &["computer_id"],
            false,
        ),
        index(
            "ix_activity_bot",
            "activity_events",
            &["bot_id", "created_at_ms"],
            false,
        ),
    ]
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for t in tables() {
            manager.create_table(t).await?;
        }
        for i in indexes() {
            manager.create_index(i).await?;
        }
        Ok(())
    }
}
