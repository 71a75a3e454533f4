//! Computers: a durable workspace plus, while active, a machine at a provider.

use sea_orm::entity::prelude::*;

/// One row of `computers`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "computers")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The space that owns it.
    pub space_id: String,
    /// The user billed for it.
    pub owner_id: String,
    /// The bot of a Private Computer; empty for a Team Computer.
    pub bot_id: Option<String>,
    /// `team` or `private`.
    pub kind: String,
    /// `team-<space id>` or the bot id; names the stored workspace.
    pub home_key: String,
    /// The provider that holds `provider_ref`.
    pub provider_kind: Option<String>,
    /// Opaque machine reference; only handed back to the same provider kind.
    pub provider_ref: Option<String>,
    /// Lifecycle state (see `ComputerState`).
    pub state: String,
    /// Latest checkpointed workspace revision (0 = none).
    pub revision: i64,
    /// A restored revision no machine has imported yet; applied before the machine is next
    /// used (`None` when there is none).
    pub pending_restore_revision: Option<i64>,
    /// Random id binding sealed archives to this computer.
    pub storage_id: String,
    /// The workspace data key, wrapped by the space's content key.
    pub wrapped_data_key: Option<Vec<u8>>,
    /// Grows with every provision or replacement of the machine.
    pub provisioning_fence: i64,
    /// Bumped by every lease change; the bump serializes lease decisions per computer.
    pub lease_epoch: i64,
    /// Set when a provider could not confirm a stop; blocks silent resumes.
    pub quarantined: bool,
    /// Last use, for idle suspension.
    pub last_active_at_ms: i64,
    /// Creation time.
    pub created_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
