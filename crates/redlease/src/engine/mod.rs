//! The lease engine: everything about holding a lock that does not depend on which
//! kind of lock it is.
//!
//! - `context`: what the locks of one client share (connections, renewal task,
//!   settings);
//! - `deadline`: when a call gives up, in checked arithmetic;
//! - `request`: one request with its retries and deadline, and the claim that undoes
//!   what a request may have left behind;
//! - `lease`: `valid_until`, `lost()`, and the ordering rule that keeps both right
//!   whatever order replies arrive in;
//! - `renewer`: one task per client renews every lease in batches;
//! - `notify`: wake-ups through pub/sub instead of polling;
//! - `acquire`: the attempt loop, and an acquisition of one lease through Redis;
//! - `guard`: the one guard core every guard is built on, and the public [`Guard`]
//!   surface;
//! - `heartbeat`: waiter entries kept alive while their waiter waits;
//! - `metrics`: what the engine counts and times, through the `metrics` facade.
//!
//! As etcd's `concurrency` package keeps liveness in its session and ordering in its
//! mutex, the engine owns liveness — renewal, extend, release, drop, `lost()` — and the
//! primitives own only their keys, scripts, reply shapes and waiting policy.

pub(crate) mod acquire;
pub(crate) mod context;
pub(crate) mod deadline;
pub(crate) mod guard;
pub(crate) mod heartbeat;
pub(crate) mod lease;
pub(crate) mod metrics;
pub(crate) mod notify;
pub(crate) mod renewer;
pub(crate) mod request;

pub use guard::Guard;
pub use lease::{Lease, LostReason};
pub use metrics::describe_metrics;
