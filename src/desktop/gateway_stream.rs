//! A byte stream through a machine's screen gateway: websockify carries the bytes of the unix
//! socket a token names as binary websocket messages; here they are read and written as one
//! stream again (for DevTools reached where no socket of the machine can be dialed).

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};

use rakazo_actors::provider::ScreenRoute;

use super::DesktopError;
use super::cdp::{Cdp, DevToolsStream, MAX_MESSAGE};
use super::runtime::DesktopRuntime;

/// Largest piece of the stream sent as one message (and the in-process buffer's size).
const CHUNK: usize = 64 * 1024;

fn err(e: impl std::fmt::Display) -> DesktopError {
    DesktopError::Browser(format!("the gateway: {e}"))
}

/// What went wrong reaching the gateway, never naming the URL (its token is a secret).
fn refused(e: &tungstenite::Error) -> DesktopError {
    match e {
        tungstenite::Error::Http(response) => err(format!("answered {}", response.status())),
        tungstenite::Error::Io(io) => err(io.kind()),
        _ => err("the websocket could not be opened"),
    }
}

/// Opens the socket of `token` through the gateway at `upstream` (`http://host:port`, as a
/// screen route names it) as a byte stream. A task carries the bytes between the websocket
/// and the stream handed back: the end of either side ends the other (the stream dropped
/// closes the websocket; the websocket closed is the stream's end).
pub async fn connect(upstream: &str, token: &str) -> Result<Box<dyn DevToolsStream>, DesktopError> {
    let base = upstream
        .strip_prefix("http://")
        .ok_or_else(|| err("not an http:// gateway"))?;
    let mut request = format!("ws://{base}/websockify?token={token}")
        .into_client_request()
        .map_err(|e| refused(&e))?;
    // websockify's binary mode: the socket's bytes as they are.
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "binary".parse().map_err(err)?);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let (socket, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .map_err(|e| refused(&e))?;
    let (mut sink, mut messages) = socket.split();
    let (ours, theirs) = tokio::io::duplex(CHUNK);
    let (mut from_caller, mut to_caller) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let inbound = async {
            while let Some(Ok(message)) = messages.next().await {
                let bytes = match message {
                    Message::Binary(bytes) => bytes,
                    Message::Close(_) => break,
                    _ => continue,
                };
                if to_caller.write_all(&bytes).await.is_err() {
                    break;
                }
            }
            let _ = to_caller.shutdown().await;
        };
        let outbound = async {
            let mut buf = vec![0u8; CHUNK];
            while let Ok(n @ 1..) = from_caller.read(&mut buf).await {
                let piece = Bytes::copy_from_slice(&buf[..n]);
                if sink.send(Message::Binary(piece)).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        };
        tokio::select! {
            () = inbound => {}
            () = outbound => {}
        }
    });
    Ok(Box::new(ours))
}

/// A DevTools connection to the bot's browser through the machine's screen gateway
/// ([`DesktopRuntime::devtools_route`]): `published` is the gateway's port as this process
/// reaches it, and `reach` turns the route into the address this process dials (a pod's
/// address, say), as the provider's screen routes are.
pub async fn devtools(
    runtime: &DesktopRuntime,
    bot_id: &str,
    published: Option<u16>,
    reach: impl FnOnce(ScreenRoute) -> ScreenRoute,
) -> Result<Cdp, DesktopError> {
    let route = runtime.devtools_route(bot_id, published).await?;
    let gateway = reach(route.route);
    let stream = connect(&gateway.upstream, &gateway.token).await?;
    Cdp::over(stream, route.port, &route.path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway that cannot be reached is reported without its URL: the token stays secret.
    #[tokio::test]
    async fn a_failure_never_names_the_token() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = listener.local_addr().unwrap();
        drop(listener);
        let token = "0123456789abcdef0123456789abcdef";
        let Err(e) = connect(&format!("http://{closed}"), token).await else {
            panic!("a closed port answered");
        };
        let said = e.to_string();
        assert!(
            !said.contains(token) && !said.contains("websockify"),
            "{said}"
        );
    }
}
