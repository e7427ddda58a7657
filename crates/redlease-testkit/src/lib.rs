//! Real Redis for redlease's tests, benchmarks and torture runs.
//!
//! - [`RedisServer`]: one `redis-server` child process on `127.0.0.1` with its own temp
//!   dir and a port no parallel test can take; `stop` / `restart` / `pause` / `resume`
//!   for fault tests; killed and reaped on drop; its log printed when the test panics.
//!   [`ServerBuilder::tls`] makes it a TLS-only server with throwaway certificates
//!   ([`TlsFiles`], made with the `openssl` command).
//! - [`RedisCluster`]: a real N-master Redis Cluster (with replicas if asked), node
//!   faults, and slot migration for resharding tests.
//! - [`RedisSentinel`]: a master, replicas and three sentinels with timeouts short
//!   enough for a failover in a few seconds.
//! - [`Proxy`]: a loopback TCP proxy that holds replies back, delays traffic, cuts
//!   connections or refuses new ones.
//!
//! `redis-server` is found through `$REDIS_SERVER_BIN` or `PATH`; when it is missing,
//! [`KitError::NotInstalled`] says how to install it.

mod cluster;
mod proxy;
mod sentinel;
mod server;
mod tls;

pub use cluster::{Migration, RedisCluster, SLOTS};
pub use proxy::Proxy;
pub use sentinel::{RedisSentinel, SentinelBuilder};
pub use server::{Persistence, RedisServer, ServerBuilder, free_port, redis_server_bin};
pub use tls::TlsFiles;

/// Why the kit could not provide a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KitError {
    /// The server binary is not installed.
    #[error(
        "{name} is not available ({detail}).\n\
         Install it with `sudo apt-get install -y redis-server` (Debian/Ubuntu), \
         `brew install redis` (macOS) or `sudo dnf install redis` (Fedora), \
         or point $REDIS_SERVER_BIN at the binary"
    )]
    NotInstalled {
        /// The binary that was looked for.
        name: String,
        /// Where it was looked for.
        detail: String,
    },
    /// The chosen port was taken by another process before the server could bind it.
    #[error("port {0} was taken before redis-server could bind it")]
    PortTaken(u16),
    /// The server exited during start-up.
    #[error("redis-server exited during start-up ({status}); its log:\n{log}")]
    ServerExited {
        /// The exit status.
        status: String,
        /// The server's log.
        log: String,
    },
    /// The server did not become ready in time.
    #[error("redis-server did not become ready in time; its log:\n{log}")]
    StartTimeout {
        /// The server's log.
        log: String,
    },
    /// Certificates for a TLS server could not be generated.
    #[error(
        "cannot generate TLS certificates: {0}\n\
         The test kit needs the `openssl` command: `sudo apt-get install -y openssl`"
    )]
    Tls(String),
    /// A cluster or sentinel set-up step failed or did not settle in time.
    #[error("test topology set-up failed: {0}")]
    Setup(String),
    /// A filesystem or process operation failed.
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
}
