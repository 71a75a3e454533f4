//! What the box-emulator tests share: the protected host URL of a sandbox's screen gateway
//! port, asked of the emulator's API as a client of Box would.

use serde_json::{Value, json};

/// `POST /sandboxes/{id}/host` for the gateway port (protected) on the API at `api` (the
/// emulator's base URL): the URL without its query, and its token.
pub async fn host_url(api: &str, key: &str, sandbox: &str) -> (String, String) {
    let v: Value = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{api}/api/v1/sandboxes/{sandbox}/host"))
        .bearer_auth(key)
        .json(&json!({ "port": rakazo::supervisor::engine::GATEWAY_PORT, "public": false }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (v["access"].as_str(), v["isProtected"].as_bool()),
        (Some("protected"), Some(true)),
        "{v}"
    );
    let (host, token) = v["url"]
        .as_str()
        .unwrap()
        .split_once("?_token=")
        .expect("the token is a query parameter");
    (host.to_owned(), token.to_owned())
}
