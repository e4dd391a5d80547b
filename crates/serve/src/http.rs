//! The HTTP/1.1 layer: hyper serving each connection on its own tokio task, with keep-alive, a header-read timeout
//! (which also closes a connection that sends nothing, or idles between requests, for that long), limits on the
//! header count and size (431), and graceful shutdown: on the signal the listener closes, idle connections close, and
//! responses in flight (streams included) finish before [`serve`] returns.

use std::future::Future;
use std::io;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// What a connection may take before the server closes it.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From the connection's start, or the end of its last response, to a request's complete headers.
    pub header_timeout: Duration,
    /// Header lines per request.
    pub max_headers: usize,
    /// Bytes of the request line and headers.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { header_timeout: Duration::from_secs(10), max_headers: 100, max_header_bytes: 16 * 1024 }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then drains as the module says.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(limits.header_timeout)
        .max_headers(limits.max_headers)
        .max_header_size(limits.max_header_bytes);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let connection = builder
                        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        // A connection's errors (a timeout, a reset, a malformed request answered by hyper) end
                        // that connection only.
                        let _ = connection.await;
                    });
                }
                // Out of file descriptors, or a connection reset before it was accepted: the listener stays.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Runs [`serve`] on a tokio runtime of its own thread, so that the caller's thread stays free for the model.
pub fn spawn(
    listener: std::net::TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<JoinHandle<io::Result<()>>> {
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    thread::Builder::new().name("http".into()).spawn(move || {
        runtime.block_on(async move { serve(TcpListener::from_std(listener)?, router, limits, shutdown).await })
    })
}
