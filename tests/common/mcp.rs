//! An MCP client for tests: one JSON-RPC message to `POST /mcp`, as an MCP client sends it.

use serde_json::{Value, json};

/// One request to the process at `base`, with a bearer token and a session when given:
/// (HTTP status, the `mcp-session-id` it answered, the body or null).
pub async fn request(
    http: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    session: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    let mut req = http
        .post(format!("{base}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params }));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(session) = session {
        req = req.header("mcp-session-id", session);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let session = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, session, resp.json().await.unwrap_or(Value::Null))
}
