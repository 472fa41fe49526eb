//! A minimal init helper for callers that are not the runcell binary (this crate's tests,
//! embedders). Behaves exactly like `runcell __sandbox-init`.
#![forbid(unsafe_code)]

fn main() {
    runcell_sandbox::run_if_init();
    eprintln!(
        "runcell-sandbox-init is started by runcell with {}",
        runcell_sandbox::INIT_ARG
    );
    std::process::exit(2);
}
