//! Binding, TLS, signals and the graceful drain.
//!
//! On SIGINT/SIGTERM the server keeps its listener open but answers new generation requests
//! with 503 and `/health` with 503, waits up to `shutdown_timeout` for in-flight requests to
//! finish, then stops serving. Whatever is still running at the timeout (or at a second
//! signal) is aborted in the engine first, so its clients get `finish_reason: "abort"` and a
//! complete response rather than a cut connection.
//!
//! If the engine dies (a failure that is not one request's: the forward pass, a scheduler
//! invariant, a panic outside per-request sampling), the server does not stay up answering
//! 503: in-flight requests get their error, connections close after a short grace, and
//! [`serve_on`] returns [`ServeError::EngineDied`], so the process exits non-zero and an
//! orchestrator restarts it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum_server::accept::DefaultAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use axum_server::Handle;
use tokenmill_engine::{Engine, PoolingEngine};

use crate::config::ServerConfig;
use crate::first_byte::FirstByteAcceptor;
use crate::parse_errors::{JsonParseErrorAcceptor, MAX_REQUEST_HEADERS, MAX_REQUEST_HEAD_BYTES};
use crate::pooling::{pooling_router, PoolingState};
use crate::routes::router;
use crate::state::AppState;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot resolve {address}: {source}")]
    Resolve {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load the TLS certificate or key: {0}")]
    Tls(std::io::Error),
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
    #[error("the engine stopped unexpectedly; the server shut down so it can be restarted")]
    EngineDied,
}

/// After a drain, how long aborted responses and open connections get to finish.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// How often the drain checks whether in-flight requests are done.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// How often the server checks that the engine thread is still running.
const ENGINE_POLL: Duration = Duration::from_millis(100);

/// Binds `host:port` before anything slow happens (the model load), so a busy port or a bad
/// address fails at once and names the address.
pub fn bind(host: &str, port: u16) -> Result<std::net::TcpListener, ServeError> {
    use std::net::ToSocketAddrs;
    let address = format!("{host}:{port}");
    let socket: SocketAddr = address
        .to_socket_addrs()
        .map_err(|source| ServeError::Resolve {
            address: address.clone(),
            source,
        })?
        .next()
        .ok_or_else(|| ServeError::Resolve {
            address: address.clone(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
        })?;
    let listener = std::net::TcpListener::bind(socket)
        .map_err(|source| ServeError::Bind { address, source })?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Binds, serves until a signal arrives and the drain completes, then shuts the engine down.
pub async fn serve(engine: Engine, config: ServerConfig) -> Result<(), ServeError> {
    let listener = bind(&config.host, config.port)?;
    serve_on(listener, engine, config).await
}

/// [`serve`] on a listener [`bind`] made.
pub async fn serve_on(
    listener: std::net::TcpListener,
    engine: Engine,
    config: ServerConfig,
) -> Result<(), ServeError> {
    let state = AppState::new(
        engine.client(),
        Arc::clone(engine.model()),
        config.clone(),
        Arc::clone(engine.metrics()),
    );
    let served = serve_state(listener, state, &config).await;
    tracing::info!("server stopped; shutting down the engine");
    engine.shutdown();
    served
}

/// Serves `state`'s app until a signal arrives and the drain completes, or until its engine
/// dies ([`ServeError::EngineDied`]). The engine is the caller's to shut down.
async fn serve_state(
    listener: std::net::TcpListener,
    state: AppState,
    config: &ServerConfig,
) -> Result<(), ServeError> {
    let app = router(state.clone());
    let handle = Handle::new();
    tokio::spawn(drain_on_signal(
        state.clone(),
        handle.clone(),
        config.shutdown_timeout,
    ));
    let watcher = tokio::spawn(stop_when_engine_dies(state.clone(), handle.clone()));
    let sweeper = tokio::spawn(crate::responses_runs::sweep_store(state.clone()));
    let served = run_app(listener, app, config, handle).await;
    watcher.abort();
    sweeper.abort();
    served?;
    // The caller shuts the engine down only after this returns: not running now means it
    // died.
    if !state.engine().is_alive() {
        return Err(ServeError::EngineDied);
    }
    Ok(())
}

/// Returns once the engine has died, after stopping the server: new requests get 503 (the
/// drain flag), in-flight ones have had their error events and get [`ABORT_GRACE`] to send
/// them, then the connections close.
async fn stop_when_engine_dies(state: AppState, handle: Handle) {
    while state.engine().is_alive() {
        tokio::time::sleep(ENGINE_POLL).await;
    }
    tracing::error!("the engine stopped unexpectedly; shutting the server down");
    state.start_draining();
    handle.graceful_shutdown(Some(ABORT_GRACE));
}

/// [`serve_on`] for a pooling model (`--runner pooling`): the pooling routes over a
/// [`PoolingEngine`], the same TLS, timeouts and drain on SIGTERM/SIGINT (new requests get
/// 503, in-flight ones get up to `shutdown_timeout` to finish).
pub async fn serve_pooling_on(
    listener: std::net::TcpListener,
    engine: PoolingEngine,
    config: ServerConfig,
) -> Result<(), ServeError> {
    let state = PoolingState::new(
        engine.client(),
        Arc::clone(engine.model()),
        config.clone(),
        Arc::clone(engine.metrics()),
    );
    let app = pooling_router(state.clone());
    let handle = Handle::new();
    let drain_handle = handle.clone();
    let timeout = config.shutdown_timeout;
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(
            "shutdown requested: draining {} in-flight requests (up to {} s)",
            state.in_flight(),
            timeout.as_secs_f64()
        );
        state.start_draining();
        let deadline = tokio::time::Instant::now() + timeout;
        tokio::select! {
            () = async {
                while state.in_flight() > 0 && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(DRAIN_POLL).await;
                }
            } => {}
            () = wait_for_signal() => tracing::warn!("second shutdown signal: not waiting for the drain"),
        }
        if state.in_flight() > 0 {
            // As for generation: abort what the engine has not started, give the answers
            // a moment to go out, then close the connections.
            tracing::warn!(
                "{} pooling requests still in flight at shutdown; aborting them",
                state.in_flight()
            );
            state.abort_in_flight();
            let grace = tokio::time::Instant::now() + ABORT_GRACE;
            while state.in_flight() > 0 && tokio::time::Instant::now() < grace {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        }
        drain_handle.graceful_shutdown(Some(ABORT_GRACE));
    });
    run_app(listener, app, &config, handle).await?;
    tracing::info!("server stopped; shutting down the pooling engine");
    engine.shutdown();
    Ok(())
}

/// Serves `app` on `listener` (TLS when configured) until `handle` shuts it down.
async fn run_app(
    listener: std::net::TcpListener,
    app: axum::Router,
    config: &ServerConfig,
    handle: Handle,
) -> Result<(), ServeError> {
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tokio::spawn(announce(handle.clone(), scheme));
    let service = app.into_make_service();
    match &config.tls {
        Some(tls) => {
            // One process-wide crypto provider; a second install (tests) is harmless.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let rustls_config = RustlsConfig::from_pem_file(&tls.cert_file, &tls.key_file)
                .await
                .map_err(ServeError::Tls)?;
            let acceptor = JsonParseErrorAcceptor::new(FirstByteAcceptor::new(
                RustlsAcceptor::new(rustls_config),
                config.header_read_timeout,
            ));
            let mut server = axum_server::from_tcp(listener).acceptor(acceptor);
            limit_header_reads(server.http_builder(), config.header_read_timeout);
            server.handle(handle).serve(service).await?;
        }
        None => {
            let acceptor = JsonParseErrorAcceptor::new(FirstByteAcceptor::new(
                DefaultAcceptor,
                config.header_read_timeout,
            ));
            let mut server = axum_server::from_tcp(listener).acceptor(acceptor);
            limit_header_reads(server.http_builder(), config.header_read_timeout);
            server.handle(handle).serve(service).await?;
        }
    }
    Ok(())
}

/// Connections that do not deliver a complete request head in time are closed: half-sent
/// request lines, headers dripped byte by byte (slow-loris), and keep-alive connections idle
/// that long. (Silent new connections are [`FirstByteAcceptor`]'s.) Heads over
/// [`MAX_REQUEST_HEAD_BYTES`] or [`MAX_REQUEST_HEADERS`] get a 431 (with a JSON body, see
/// [`JsonParseErrorAcceptor`]).
fn limit_header_reads(
    builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    timeout: Duration,
) {
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeout)
        .max_buf_size(MAX_REQUEST_HEAD_BYTES)
        .max_headers(MAX_REQUEST_HEADERS);
}

/// Logs the bound address once listening (with `--port 0`, the port the OS chose).
async fn announce(handle: Handle, scheme: &'static str) {
    if let Some(address) = handle.listening().await {
        tracing::info!("Listening on {scheme}://{address}");
    }
}

async fn drain_on_signal(state: AppState, handle: Handle, timeout: Duration) {
    wait_for_signal().await;
    tracing::info!(
        "shutdown requested: draining {} in-flight requests (up to {} s)",
        state.in_flight(),
        timeout.as_secs_f64()
    );
    state.start_draining();
    let deadline = tokio::time::Instant::now() + timeout;
    let drained = tokio::select! {
        () = wait_for_in_flight(&state, deadline) => state.in_flight() == 0,
        // A second Ctrl-C / SIGTERM means "stop now", as with vLLM's uvicorn.
        () = wait_for_signal() => {
            tracing::warn!("second shutdown signal: not waiting for the drain");
            false
        }
    };
    if !drained {
        // Abort what is left in the engine: streams end with `finish_reason: "abort"` and
        // `[DONE]`, non-streaming requests get their partial output, then connections close.
        let aborted = state.abort_in_flight();
        tracing::warn!("{aborted} engine requests still running at shutdown; aborting them");
        let grace = tokio::time::Instant::now() + ABORT_GRACE;
        wait_for_in_flight(&state, grace).await;
    }
    handle.graceful_shutdown(Some(ABORT_GRACE));
}

/// Returns once no generation request is in flight or `deadline` passed.
async fn wait_for_in_flight(state: &AppState, deadline: tokio::time::Instant) {
    while state.in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Instant;

    use tokenmill_engine::{EngineConfig, KvCacheSizing};
    use tokenmill_models::ModelSource;

    use super::*;

    fn model_path() -> PathBuf {
        std::env::var("TOKENMILL_TEST_MODEL").map_or_else(
            |_| tokenmill_models::default_model_path().unwrap_or_default(),
            PathBuf::from,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_engine_stops_the_server_with_an_error() {
        let mut engine_config = EngineConfig::new(ModelSource::from_path(model_path()));
        engine_config.kv_cache = KvCacheSizing::Bytes(16 << 20);
        engine_config.max_model_len = Some(128);
        engine_config.num_threads = Some(1);
        engine_config.log_stats_interval = None;
        let engine = Engine::start(&engine_config).unwrap();
        let config = ServerConfig::new(vec!["tm-test".to_string()]);
        let state = AppState::new(
            engine.client(),
            Arc::clone(engine.model()),
            config.clone(),
            Arc::clone(engine.metrics()),
        );
        let listener = bind("127.0.0.1", 0).unwrap();
        let address = listener.local_addr().unwrap();
        let serving = state.clone();
        let server = tokio::spawn(async move { serve_state(listener, serving, &config).await });
        // Serving while the engine runs.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!server.is_finished());
        assert!(tokio::net::TcpStream::connect(address).await.is_ok());
        // The engine thread ends (as after a failed step): the server stops and says why.
        let died_at = Instant::now();
        engine.shutdown();
        let served = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server kept running over a dead engine")
            .unwrap();
        assert!(matches!(served, Err(ServeError::EngineDied)), "{served:?}");
        assert!(died_at.elapsed() < Duration::from_secs(3));
        assert!(state.is_draining());
    }
}
