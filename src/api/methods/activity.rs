//! The activity feed and the Files window: history of a bot's commands, and browsing a
//! computer's workspace (from the home store's latest copy when the computer is stopped,
//! under the same file rules as a running computer's).

use base64::Engine;
use rakazo_actors::activity;
use rakazo_actors::computer::{Call, CurrentMachine, Op, OpOutput};
use rakazo_actors::leases::{LeaseKey, Leases};
use rakazo_actors::provider::{ListingPage, ProviderError};
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::computers::{handle, of_bot};
use super::{Ctx, access};
use crate::providers::beneath::MAX_LISTED_ENTRIES;
use crate::providers::workspace_path::normalize;

/// Largest file the Files window previews or uploads.
const MAX_FILE_BYTES: usize = 8 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListActivity {
    bot_id: String,
    before_ms: Option<i64>,
    limit: Option<u64>,
}

/// `activity.list {botId, beforeMs?, limit?}`: `computer.command` events, newest first.
pub async fn list(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ListActivity = super::params(params)?;
    access::bot(ctx.db(), ctx.caller, &p.bot_id).await?;
    let items = activity::history(ctx.db(), &p.bot_id, p.before_ms, p.limit.unwrap_or(100)).await?;
    Ok(serde_json::to_value(items).unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FilePath {
    bot_id: String,
    #[serde(default)]
    path: String,
}

/// Read from the running machine when there is one, else from the stored latest copy.
async fn running(
    ctx: &Ctx<'_>,
    bot_id: &str,
) -> DomainResult<(rakazo_actors::entity::computer::Model, bool)> {
    let c = of_bot(ctx, bot_id).await?;
    let live = handle(ctx, &c)
        .computer
        .send(CurrentMachine)
        .await?
        .is_some();
    Ok((c, live))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListPath {
    bot_id: String,
    #[serde(default)]
    path: String,
    first: Option<usize>,
    #[serde(default)]
    from: String,
}

/// Entries `files.list` gives of a folder unless asked for another number.
const BROWSED: usize = 5000;

/// `files.list {botId, path, first?, from?}`: a folder of the bot's computer, also when it
/// is stopped: its first `first` entries by name (5000 unless given, at most
/// [`MAX_LISTED_ENTRIES`]) from the name `from` on, how many it holds (`total`) and, where
/// more follow, the name the next page starts at (`next`, `truncated`).
pub async fn list_files(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ListPath = super::params(params)?;
    let first = p.first.unwrap_or(BROWSED);
    if !(1..=MAX_LISTED_ENTRIES).contains(&first) {
        return Err(DomainError::invalid(format!(
            "first must be between 1 and {MAX_LISTED_ENTRIES}"
        )));
    }
    let range = crate::tools::listing_range(p.from, first)?;
    let (c, live) = running(ctx, &p.bot_id).await?;
    let page = if live {
        match handle(ctx, &c)
            .computer
            .send(Call(Op::Look(Box::new(Op::ListFirst(
                p.path.clone(),
                range,
            )))))
            .await??
        {
            OpOutput::Page(page) => page,
            _ => ListingPage::default(),
        }
    } else {
        let entries = ctx
            .app
            .runtime()
            .homes
            .list_latest(&c.home_key, &p.path)
            .await?;
        ListingPage::of(entries, &range)
    };
    Ok(json!({
        "path": p.path, "live": live, "entries": page.entries,
        "total": page.total, "truncated": page.next.is_some(), "next": page.next,
    }))
}

/// `files.read {botId, path}`: preview a file (text or base64), also when stopped.
pub async fn read_file(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: FilePath = super::params(params)?;
    let (c, live) = running(ctx, &p.bot_id).await?;
    let bytes = if live {
        match handle(ctx, &c)
            .computer
            .send(Call(Op::Look(Box::new(Op::ReadFile(
                p.path.clone(),
                MAX_FILE_BYTES as u64,
            )))))
            .await
            .map_err(DomainError::from)?
            .map_err(|e| {
                if e.code == ErrorCode::TooLarge {
                    DomainError::new(ErrorCode::TooLarge, "the file is larger than 8 MiB")
                } else {
                    e
                }
            })? {
            OpOutput::Bytes(b) => b,
            _ => Vec::new(),
        }
    } else {
        match ctx
            .app
            .runtime()
            .homes
            .read_latest(&c.home_key, &p.path, MAX_FILE_BYTES as u64)
            .await
        {
            Ok(bytes) => bytes,
            Err(ProviderError::TooLarge(_)) => {
                return Err(DomainError::new(
                    ErrorCode::TooLarge,
                    "the file is larger than 8 MiB",
                ));
            }
            Err(e) => return Err(e.into()),
        }
    };
    if bytes.len() > MAX_FILE_BYTES {
        return Err(DomainError::new(
            ErrorCode::TooLarge,
            "the file is larger than 8 MiB",
        ));
    }
    let size = bytes.len();
    Ok(match String::from_utf8(bytes) {
        Ok(text) => json!({ "path": p.path, "size": size, "live": live, "text": text }),
        Err(e) => json!({ "path": p.path, "size": size, "live": live,
                          "base64": base64::engine::general_purpose::STANDARD.encode(e.as_bytes()) }),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Upload {
    bot_id: String,
    name: String,
    content_base64: String,
}

/// `files.upload {botId, name, contentBase64}`: needs the caller's control of the bot's
/// screen and a running computer; lands under the bot's workspace path, capped.
pub async fn upload(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: Upload = super::params(params)?;
    let (b, _) = access::bot(ctx.db(), ctx.caller, &p.bot_id).await?;
    let (c, live) = running(ctx, &p.bot_id).await?;
    let control = Leases::new(ctx.db().clone())
        .live(&LeaseKey::control(&c.id, &p.bot_id))
        .await?;
    if control.is_none_or(|g| g.holder != ctx.caller.user_id) {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "take control of the bot's screen to upload",
        ));
    }
    if !live {
        return Err(DomainError::new(
            ErrorCode::ComputerUnavailable,
            "the computer is stopped",
        ));
    }
    if p.name.contains('/') || normalize(&p.name, false).is_err() {
        return Err(DomainError::new(
            ErrorCode::PathRejected,
            "a file name, without folders",
        ));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(p.content_base64)
        .map_err(|_| DomainError::invalid("contentBase64 is not base64"))?;
    if data.len() > MAX_FILE_BYTES {
        return Err(DomainError::new(
            ErrorCode::TooLarge,
            "uploads are limited to 8 MiB",
        ));
    }
    let dir = if b.computer_mode == "team" {
        format!("bots/{}/uploads", b.id)
    } else {
        "uploads".into()
    };
    let path = format!("{dir}/{}", p.name);
    let size = data.len();
    handle(ctx, &c)
        .computer
        .send(Call(Op::WriteFile(path.clone(), data)))
        .await??;
    Ok(json!({ "path": path, "size": size }))
}
