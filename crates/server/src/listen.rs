//! The accept loop, where slow and greedy clients are stopped before any handler runs: at most
//! `max_connections` open at once (one more is answered 503 and closed), and hyper's header
//! read timeout (a connection whose first request's headers do not arrive in time gets 408).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, RETRY_AFTER_SECONDS};
use crate::limits::Limits;

/// How long a refusal may take to write, and to read what the client still sends after it.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `stop` fires.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut stop: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait, go on.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(connection(stream, router.clone(), limits.clone(), permit));
            }
            Err(_) => {
                let refusal = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    limits.too_many_connections(),
                );
                tokio::spawn(refuse(stream, refusal));
            }
        }
    }
}

/// One connection, HTTP/1.1, holding `_permit` while it is open.
async fn connection(
    stream: TcpStream,
    router: Router,
    limits: Arc<Limits>,
    _permit: OwnedSemaphorePermit,
) {
    // A second handle on the socket, to answer 408 once hyper has given up on the headers.
    let (stream, spare) = match split_handle(stream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!("cannot serve a connection: {e}");
            return;
        }
    };
    let served = Arc::new(AtomicBool::new(false));
    let seen = served.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        seen.store(true, Ordering::Relaxed);
        let mut router = router.clone();
        async move {
            let response: Result<Response<Body>, Infallible> =
                tower_service::Service::call(&mut router, req).await;
            response
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    match builder
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        // Idle keep-alive connections just close; a client that never finished its first
        // request's headers is told why.
        Err(e) if e.is_timeout() && !served.load(Ordering::Relaxed) => {
            let refusal = ApiError::new(StatusCode::REQUEST_TIMEOUT, limits.headers_too_slow());
            if let Ok(spare) = TcpStream::from_std(spare) {
                refuse(spare, refusal).await;
            }
        }
        Err(e) => tracing::debug!("connection ended: {e}"),
        Ok(()) => {}
    }
}

/// The stream, and a second handle on its socket.
fn split_handle(stream: TcpStream) -> std::io::Result<(TcpStream, std::net::TcpStream)> {
    let std = stream.into_std()?;
    let spare = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, spare))
}

/// Answers `refusal` (OpenAI's error shape: no route is known yet) and closes the connection,
/// reading for a moment what the client still sends so that the answer is not lost to a reset.
async fn refuse(mut stream: TcpStream, refusal: ApiError) {
    let body = refusal.body().to_string();
    let status = refusal.status;
    let mut head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        head += &format!("retry-after: {RETRY_AFTER_SECONDS}\r\n");
    }
    let answer = async {
        let mut out = head.into_bytes();
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body.as_bytes());
        let mut sent = 0;
        while sent < out.len() {
            stream.writable().await?;
            match stream.try_write(&out[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        // The answer is complete: the client reads to its end.
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_shutdown(cx)).await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < 1 << 16 {
            stream.readable().await?;
            match stream.try_read(&mut sink) {
                Ok(0) => break,
                Ok(n) => drained += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(REFUSAL_TIME, answer).await;
}
