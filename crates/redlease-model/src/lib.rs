//! A model of redlease's lock protocol, checked exhaustively with
//! [stateright](https://docs.rs/stateright).
//!
//! The model runs the protocol as the code does — the server's keys with expiry on the
//! server's clock, each Lua script as one atomic step, the client's lease engine — over
//! a network that delays, reorders and loses messages, with client clocks that drift
//! and clients that pause, retry and crash. The checker visits every state reachable
//! within the bounds and checks, in each:
//!
//! - **mutual exclusion of belief**: no two clients (for a semaphore: no more than its
//!   limit; for the multi-lock: per name) believe they hold at the same instant of real
//!   time — `now < valid_until` by their own clock, and the lease not lost;
//! - **fencing**: a fenced resource never accepts two holders' writes interleaved;
//! - **no orphan**: a key whose token nobody can renew or release any more lives at
//!   most one TTL;
//! - **a lost reply does not lie**: an acquire is never told the lock is busy while
//!   its own token holds it.
//!
//! The same checker runs on variants with one rule of the protocol removed; each must
//! fail with a counterexample (`tests/variants.rs`). `docs/model.md` explains it all for
//! a reader who knows locks but not model checking.
//!
//! Map:
//!
//! ```text
//! config.rs    what is checked: the kind of lock, the timing, the bounds, the rules
//! checks.rs    the configurations CI checks (and the longer run), and running them
//! net.rs       tokens, requests, replies, the network
//! server.rs    Redis: keys with expiry, one function per script (named by its .lua)
//! client.rs    the lease engine as a state machine (engine/lease.rs, acquire.rs)
//! model.rs     stateright's Model: the state, the actions, the properties
//! steps.rs     what each action does: scripts on the server, replies on the clients
//! canonical.rs states that behave the same made one (relative time, renumbered tokens)
//! trace.rs     counterexamples as readable traces
//! scripts.rs   the mirrored scripts and the hashes they were reviewed at
//! ```
//!
//! The multi-lock is a fourth [`Kind`]: the server holds the keys of two names (`x`
//! and `y`, in one hash slot), its acquire, renewal and release run over both in one
//! step, beside a plain mutex of one of them, and the properties are checked per name.

pub mod canonical;
pub mod checks;
pub mod client;
pub mod config;
pub mod model;
pub mod net;
pub mod scripts;
pub mod server;
mod steps;
pub mod trace;

pub use config::{Bounds, Kind, Rules, Timing, Variant};
pub use model::{Action, LockModel, State, property};
