//! A sandbox's way out, when its network policy allows one: the host-side proxy.
//!
//! A sandbox with a policy has one TCP socket listening on its own loopback (made by its pid 1,
//! taken over by the host; `runcell_sandbox::Running::egress_listener`); [`Egress::serve`]
//! serves it here, on the host, with the host's network. Nothing else in the sandbox has a route
//! out. Each request names its destination (an HTTP `CONNECT`, or an absolute-form plain HTTP
//! request); the proxy checks the name against the session's [`Policy`], resolves it itself,
//! checks every address against the forbidden ranges (loopback, link-local, private, the host's
//! own), connects to the address it checked, and records the connection. What it refuses gets
//! an HTTP 403 whose body says which rule refused what. docs/sandbox.md has the threat model.
#![forbid(unsafe_code)]

mod addr;
mod ca;
mod http;
mod intercept;
mod policy;
mod proxy;
mod state;
mod tls;

pub use addr::{Cidr, CidrError};
pub use ca::{Authority, CaError};
pub use intercept::{Interception, TrustError};
pub use policy::{
    parse_all, DomainPattern, DomainSecret, PatternError, Policy, PolicyBounds, PolicyError,
};
pub use proxy::{ConnectionRecord, Egress, Serving, SessionEgress, MAX_RECORDS};
pub use state::EgressLimits;
