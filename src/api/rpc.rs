//! JSON-RPC 2.0 envelopes: parsing requests, shaping results and errors. Errors carry the
//! stable code string in `error.data.code`; over HTTP a single failed call also sets the HTTP
//! status of its code (409 for `STOP_BOT_FIRST`).

use rakazo_actors::{DomainError, ErrorCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::methods::{self, Ctx};

/// Largest accepted request body (encoded), as the spec bounds writes.
pub const MAX_REQUEST_BYTES: usize = 12 * 1024 * 1024;

/// Most calls in one batch; a longer batch is refused whole with `TOO_LARGE`.
pub const MAX_BATCH: usize = 50;

/// One request object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Must be `"2.0"`.
    pub jsonrpc: String,
    /// Absent for notifications.
    #[serde(default)]
    pub id: Option<Value>,
    /// Method name.
    pub method: String,
    /// Parameters (object).
    #[serde(default)]
    pub params: Value,
}

fn numeric(code: ErrorCode) -> i64 {
    match code {
        ErrorCode::InvalidParams => -32602,
        ErrorCode::MethodNotFound => -32601,
        ErrorCode::Internal => -32603,
        _ => -32000,
    }
}

/// An error response object.
pub fn error(id: Value, err: &DomainError) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id,
        "error": { "code": numeric(err.code), "message": err.message,
                   "data": { "code": err.code.as_str(), "httpStatus": err.code.http_status() } }
    })
}

/// A protocol-level error (parse error, invalid request).
pub fn protocol_error(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message,
            "data": { "code": "INVALID_PARAMS", "httpStatus": 400 } } })
}

/// A result response object.
pub fn result(id: Value, value: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": value })
}

/// Handle one request value; `None` for notifications. The second item is the HTTP status a
/// lone response should carry.
pub async fn handle_one(ctx: &Ctx<'_>, raw: Value) -> (Option<Value>, u16) {
    let req: Request = match serde_json::from_value(raw) {
        Ok(req) => req,
        Err(_) => {
            return (
                Some(protocol_error(Value::Null, -32600, "invalid request")),
                400,
            );
        }
    };
    let id = req.id.clone().unwrap_or(Value::Null);
    if req.jsonrpc != "2.0" {
        return (
            Some(protocol_error(id, -32600, "jsonrpc must be \"2.0\"")),
            400,
        );
    }
    let outcome = methods::call(ctx, &req.method, req.params).await;
    if let Err(err) = &outcome {
        tracing::info!(event = "rpc.failed", method = %req.method, code = err.code.as_str());
    }
    if req.id.is_none() {
        return (None, 204);
    }
    match outcome {
        Ok(value) => (Some(result(id, value)), 200),
        Err(err) => (Some(error(id, &err)), err.code.http_status()),
    }
}

/// Handle a body: one request or a batch. Returns the response body and HTTP status.
pub async fn handle_body(ctx: &Ctx<'_>, body: &[u8]) -> (Value, u16) {
    let parsed: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => return (protocol_error(Value::Null, -32700, "parse error"), 400),
    };
    match parsed {
        Value::Array(items) if items.len() > MAX_BATCH => {
            let err = DomainError::new(
                ErrorCode::TooLarge,
                format!("a batch holds at most {MAX_BATCH} calls"),
            );
            (error(Value::Null, &err), err.code.http_status())
        }
        Value::Array(items) if !items.is_empty() => {
            let mut out = Vec::new();
            for item in items {
                if let (Some(resp), _) = handle_one(ctx, item).await {
                    out.push(resp);
                }
            }
            (Value::Array(out), 200)
        }
        Value::Array(_) => (protocol_error(Value::Null, -32600, "empty batch"), 400),
        single => {
            let (resp, status) = handle_one(ctx, single).await;
            (resp.unwrap_or(Value::Null), status)
        }
    }
}
