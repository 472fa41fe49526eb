//! Shared set-up for the engine's integration tests.

/// A fresh engine with the default Python runtime (installed once into the target dir).
pub fn engine() -> runcell_engine::testing::TestEngine {
    runcell_engine::testing::engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")))
}
