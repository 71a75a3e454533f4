//! Settings of this deployment, one row per name (its random `deployment_id` among them).

use sea_orm::entity::prelude::*;

/// One row of `deployment_settings`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "deployment_settings")]
pub struct Model {
    /// The setting's name.
    #[sea_orm(primary_key, auto_increment = false)]
    pub name: String,
    /// Its value.
    pub value: String,
    /// When it was first set.
    pub created_at_ms: i64,
}

/// No declared relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
