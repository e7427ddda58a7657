//! A loopback TCP proxy that injects network faults between a client and Redis.
//!
//! Everything the client sends goes to the upstream server and back through the proxy,
//! so a test can hold replies back past the client's response timeout (a request that
//! landed whose reply is lost), hold requests, add delay, cut every open connection, or refuse new ones.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct Control {
    upstream: std::sync::Mutex<SocketAddr>,
    hold_replies: watch::Sender<bool>,
    hold_requests: watch::Sender<bool>,
    delay: watch::Sender<Duration>,
    cut: watch::Sender<u64>,
    refuse: AtomicBool,
    open: AtomicUsize,
    accepted: AtomicUsize,
}

/// A fault-injecting TCP proxy on `127.0.0.1`; stops (and cuts every connection) on drop.
pub struct Proxy {
    addr: SocketAddr,
    ctl: Arc<Control>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("addr", &self.addr).finish()
    }
}

impl Proxy {
    /// Starts a proxy on a free loopback port that forwards to `upstream`.
    ///
    /// Must be called inside a tokio runtime, which runs the proxy's tasks.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let ctl = Arc::new(Control {
            upstream: std::sync::Mutex::new(upstream),
            hold_replies: watch::channel(false).0,
            hold_requests: watch::channel(false).0,
            delay: watch::channel(Duration::ZERO).0,
            cut: watch::channel(0).0,
            refuse: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, ctl.clone()));
        Ok(Self { addr, ctl, task })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Points new connections at another upstream (open ones keep theirs).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.ctl.upstream.lock().expect("proxy lock") = upstream;
    }

    /// Stops forwarding server → client bytes; they wait in the proxy until
    /// [`release_replies`](Self::release_replies). Requests still reach the server.
    pub fn hold_replies(&self) {
        self.ctl.hold_replies.send_replace(true);
    }

    /// Delivers held replies and forwards again.
    pub fn release_replies(&self) {
        self.ctl.hold_replies.send_replace(false);
    }

    /// Stops forwarding client → server bytes until [`release_requests`](Self::release_requests).
    pub fn hold_requests(&self) {
        self.ctl.hold_requests.send_replace(true);
    }

    /// Delivers held requests and forwards again.
    pub fn release_requests(&self) {
        self.ctl.hold_requests.send_replace(false);
    }

    /// Delays every chunk, in both directions, by `delay` (zero turns it off).
    pub fn set_delay(&self, delay: Duration) {
        self.ctl.delay.send_replace(delay);
    }

    /// Closes every open connection at once (both sides); new ones are still accepted.
    pub fn cut(&self) {
        self.ctl.cut.send_modify(|g| *g += 1);
    }

    /// While `true`, new connections are accepted and closed immediately.
    pub fn set_refuse(&self, refuse: bool) {
        self.ctl.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Connections currently open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.ctl.open.load(Ordering::SeqCst)
    }

    /// Connections accepted since the proxy started.
    pub fn accepted_connections(&self) -> usize {
        self.ctl.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn accept_loop(listener: TcpListener, ctl: Arc<Control>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        ctl.accepted.fetch_add(1, Ordering::SeqCst);
        if ctl.refuse.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let ctl = ctl.clone();
        tokio::spawn(async move {
            let upstream = *ctl.upstream.lock().expect("proxy lock");
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            ctl.open.fetch_add(1, Ordering::SeqCst);
            let generation = *ctl.cut.borrow();
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let requests = pump(
                client_read,
                server_write,
                ctl.hold_requests.subscribe(),
                ctl.delay.subscribe(),
                ctl.cut.subscribe(),
                generation,
            );
            let replies = pump(
                server_read,
                client_write,
                ctl.hold_replies.subscribe(),
                ctl.delay.subscribe(),
                ctl.cut.subscribe(),
                generation,
            );
            // When either direction ends, the connection is over: dropping the other
            // pump closes its sockets too.
            tokio::select! {
                _ = requests => {}
                _ = replies => {}
            }
            ctl.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut hold: watch::Receiver<bool>,
    delay: watch::Receiver<Duration>,
    mut cut: watch::Receiver<u64>,
    generation: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = cut.wait_for(|g| *g != generation) => return,
        };
        tokio::select! {
            r = hold.wait_for(|held| !*held) => if r.is_err() { return },
            _ = cut.wait_for(|g| *g != generation) => return,
        }
        let d = *delay.borrow();
        if !d.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = cut.wait_for(|g| *g != generation) => return,
            }
        }
        tokio::select! {
            r = to.write_all(&buf[..n]) => if r.is_err() { return },
            _ = cut.wait_for(|g| *g != generation) => return,
        }
    }
}
