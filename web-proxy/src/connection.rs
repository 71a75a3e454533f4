//! The browser's TCP connection of a relayed websocket: Nagle's algorithm off, and ended by the
//! relay once its close frame is out.
//!
//! When a relayed websocket's response ends (after its close frame), actix-http does not close
//! the connection: it lingers, waiting for the client to close first, up to the server's
//! `client_disconnect_timeout` (1 s by default). A browser waits for the server to close first
//! (RFC 6455, 7.1.1), so every closed screen socket would stay connected that long.
//!
//! [`on_connect`], registered with `HttpServer::on_connect`, keeps a duplicate of each accepted
//! TCP socket (a file descriptor of its own, never the server's) in the connection's data. The
//! relay takes it ([`BrowserConnection::prepare`]) and, once the response has ended, shuts the
//! socket's *reading* side down ([`BrowserConnection::end`]): actix-http then reads end of file,
//! writes out whatever it still holds (the close frame included) and closes the connection
//! itself, as it does when a client goes away. Nothing is ever written or closed behind
//! actix-http's back, so the close frame always leaves before the connection's end. Without
//! `on_connect` (or over TLS) there is no duplicate: Nagle's algorithm stays on and
//! connections end after the linger.

use std::any::Any;
use std::cell::Cell;
use std::error::Error as StdError;
use std::future::Future as _;
use std::net::Shutdown;
use std::os::fd::{AsFd as _, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::Extensions;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse};
use tokio::sync::oneshot;

/// A duplicate of one accepted TCP connection's socket, kept in the connection's data until a
/// relayed websocket on that connection takes it.
struct ConnectionSocket(Cell<Option<OwnedFd>>);

/// For `HttpServer::on_connect` of every server that mounts the proxy
/// (`HttpServer::new(..).on_connect(rakazo_web_proxy::on_connect)`): keeps a duplicate of each
/// plain TCP connection's socket so the relay can end the connection as soon as a websocket's
/// close frame is out (one more file descriptor per open connection, closed with it or when
/// the relay is done). Other transports (TLS, Unix sockets) are left alone.
pub fn on_connect(io: &dyn Any, extensions: &mut Extensions) {
    let Some(tcp) = io.downcast_ref::<actix_web::rt::net::TcpStream>() else {
        return;
    };
    match tcp.as_fd().try_clone_to_owned() {
        Ok(fd) => {
            extensions.insert(ConnectionSocket(Cell::new(Some(fd))));
        }
        Err(e) => tracing::event!(
            name: "screen.proxy.connection_not_kept",
            tracing::Level::WARN,
            error = %e.kind(),
            "screen.proxy.connection_not_kept"
        ),
    }
}

/// A relayed websocket's browser connection, through its duplicate socket: Nagle's algorithm
/// off, and its end: the response is held open after the close frame until
/// [`BrowserConnection::end`], which then ends the connection.
pub(crate) struct BrowserConnection {
    socket: std::net::TcpStream,
    release: oneshot::Sender<()>,
    ended: oneshot::Receiver<()>,
}

impl BrowserConnection {
    /// Takes `req`'s connection socket for the websocket `response`, if the server keeps
    /// connection sockets ([`on_connect`]) and no earlier request on the connection took it,
    /// and turns Nagle's algorithm off on it. The response is then held open after its last
    /// frame (the close frame) until [`BrowserConnection::end`]: while it is open, actix-http
    /// still reads the browser's side into the message stream, so the relay can see the
    /// browser's close reply.
    pub(crate) fn prepare(
        req: &HttpRequest,
        response: HttpResponse,
    ) -> (HttpResponse, Option<BrowserConnection>) {
        let Some(fd) = req
            .conn_data::<ConnectionSocket>()
            .and_then(|kept| kept.0.take())
        else {
            return (response, None);
        };
        let socket = std::net::TcpStream::from(fd);
        // A screen's messages come in bursts (an update's rectangles, then small ones): with
        // Nagle's algorithm the burst's last small segment waits for the browser's (delayed)
        // acknowledgement of the previous one, up to 40 ms.
        let _ = socket.set_nodelay(true);
        let (release, released) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        let response = response
            .map_body(|_, inner| HeldBody {
                inner,
                inner_ended: false,
                released,
                _ended: ended_tx,
            })
            .map_into_boxed_body();
        let connection = BrowserConnection {
            socket,
            release,
            ended,
        };
        (response, Some(connection))
    }

    /// Once the close frame is queued: lets the response end and, when actix-http has taken its
    /// last bytes (within `within`), stops reading the connection, so actix-http reads end of
    /// file, writes out what it holds (the close frame included) and closes the connection.
    /// The duplicate socket is closed here.
    pub(crate) async fn end(self, within: Duration) -> bool {
        drop(self.release);
        let ended = tokio::time::timeout(within, self.ended).await.is_ok();
        if ended {
            let _ = self.socket.shutdown(Shutdown::Read);
        }
        ended
    }
}

/// A response body that stays open after its inner body ended, until released. The inner body
/// is kept until then: actix-ws ends its message stream when its body is dropped.
struct HeldBody {
    inner: BoxBody,
    inner_ended: bool,
    released: oneshot::Receiver<()>,
    /// Dropped with the body: actix-http has taken its last bytes (or the connection is gone).
    _ended: oneshot::Sender<()>,
}

impl MessageBody for HeldBody {
    type Error = Box<dyn StdError>;

    fn size(&self) -> BodySize {
        self.inner.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        if !this.inner_ended {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(None) => this.inner_ended = true,
                other => return other,
            }
        }
        Pin::new(&mut this.released).poll(cx).map(|_| None)
    }
}
