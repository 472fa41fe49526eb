//! The app bound to port 0 for the server's tests, torn down without leftovers.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::sync::Arc;

use runcell_store::Store;

pub struct Server {
    pub base: String,
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
    start_with(chat, |_| {}).await
}

/// [`start_with_chat`], with the engine's configuration changed by `configure` first (its
/// limit policy, a zygote).
pub async fn start_with(
    chat: Option<runcell_server::ChatConfig>,
    configure: impl FnOnce(&mut runcell_engine::EngineConfig) + Send + 'static,
) -> Server {
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let config = tokio::task::spawn_blocking(move || {
        let mut config = runcell_engine::testing::engine_config(&cache);
        configure(&mut config);
        config
    })
    .await
    .expect("config");
    let store = Store::open(&config.data_dir.join("runcell.db")).expect("store");
    let audit = Arc::new(runcell_server::StoreAudit(store.clone()));
    let engine = runcell_engine::Engine::with_audit(config, Some(audit)).expect("engine");
    let mut state = runcell_server::state(engine.clone(), store.clone(), true);
    if let Some(chat) = chat {
        state = state.with_chat(chat);
    }
    let router = runcell_server::app(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(runcell_server::serve(listener, router, async move {
        let _ = rx.await;
    }));
    Server {
        base,
        store,
        http: reqwest::Client::new(),
        engine,
        _shutdown: tx,
    }
}
