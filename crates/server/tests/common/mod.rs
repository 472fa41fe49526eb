//! The app bound to port 0 for the server's tests, torn down without leftovers.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use runcell_store::Store;

pub struct Server {
    pub base: String,
    pub addr: std::net::SocketAddr,
    pub store: Store,
    pub http: reqwest::Client,
    pub engine: runcell_engine::Engine,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Drop for Server {
    /// No sandbox or workspace mount outlives the test.
    fn drop(&mut self) {
        self.engine.sessions().shutdown();
    }
}

/// A server on 127.0.0.1:0 with the shared Python runtime and its own data dir and database.
pub async fn start() -> Server {
    start_with_chat(None).await
}

/// [`start`], with the chat (`/v1/chat`) talking to `chat`'s model when given.
pub async fn start_with_chat(chat: Option<runcell_server::ChatConfig>) -> Server {
    start_with(move |state| match chat {
        Some(chat) => state.with_chat(chat),
        None => state,
    })
    .await
}

/// [`start`], with the state changed by `configure` (allowed hosts, say) before serving.
pub async fn start_with(
    configure: impl FnOnce(runcell_server::AppState) -> runcell_server::AppState,
) -> Server {
    start_configured(|_| {}, configure, runcell_server::ServeOptions::default()).await
}

/// [`start_with`], its connections bounded by `options` (short timeouts, a small cap).
pub async fn start_with_options(
    configure: impl FnOnce(runcell_server::AppState) -> runcell_server::AppState,
    options: runcell_server::ServeOptions,
) -> Server {
    start_configured(|_| {}, configure, options).await
}

/// [`start_with_chat`], with the engine's configuration changed by `configure` first (its
/// limit policy, a zygote).
pub async fn start_engine_with(
    chat: Option<runcell_server::ChatConfig>,
    configure: impl FnOnce(&mut runcell_engine::EngineConfig) + Send + 'static,
) -> Server {
    start_configured(
        configure,
        move |state| match chat {
            Some(chat) => state.with_chat(chat),
            None => state,
        },
        runcell_server::ServeOptions::default(),
    )
    .await
}

/// The server, with the engine's configuration changed by `engine`, then the state by
/// `state`, its connections bounded by `options`.
pub async fn start_configured(
    engine: impl FnOnce(&mut runcell_engine::EngineConfig) + Send + 'static,
    state: impl FnOnce(runcell_server::AppState) -> runcell_server::AppState,
    options: runcell_server::ServeOptions,
) -> Server {
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let config = tokio::task::spawn_blocking(move || {
        let mut config = runcell_engine::testing::engine_config(&cache);
        engine(&mut config);
        config
    })
    .await
    .expect("config");
    let store = Store::open(&config.data_dir.join("runcell.db")).expect("store");
    let engine = runcell_engine::Engine::with_store(config, store.domain()).expect("engine");
    // Bound first: the server answers to its real port only.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = state(runcell_server::state(engine.clone(), store.clone(), addr));
    let router = runcell_server::app(state);
    let base = format!("http://{addr}");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(runcell_server::serve_with(
        listener,
        router,
        async move {
            let _ = rx.await;
        },
        options,
    ));
    Server {
        base,
        addr,
        store,
        http: reqwest::Client::new(),
        engine,
        _shutdown: tx,
    }
}

/// Reads one response (headers and a Content-Length body) off `tcp`.
pub fn read_response(tcp: &mut std::net::TcpStream) -> String {
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().expect("length"))
                })
                .unwrap_or(0);
            if body.len() >= len {
                return text;
            }
        }
        let n = std::io::Read::read(tcp, &mut buf).expect("read a response");
        assert!(n > 0, "connection closed mid-response: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}
