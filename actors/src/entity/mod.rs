//! sea-orm entities, one module per table; the schema itself lives in the migrations crate.

pub mod activity_event;
pub mod api_token;
pub mod bot;
pub mod computer;
pub mod computer_owner;
pub mod computer_run;
pub mod deployment_setting;
pub mod home_revision;
pub mod home_tombstone;
pub mod lease;
pub mod maintenance_operation;
pub mod mcp_session;
pub mod process;
pub mod recording_frame;
pub mod recording_step;
pub mod run;
pub mod screen;
pub mod space;
pub mod space_member;
pub mod timeline_entry;
pub mod timeline_head;
pub mod user;
