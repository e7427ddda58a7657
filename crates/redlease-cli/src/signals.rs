//! Signals sent to redlease while it waits for a lock or runs CMD.
//!
//! redlease must not die of SIGINT, SIGTERM or SIGHUP while it holds a lock: it passes
//! the signal on to CMD and releases the lock once CMD has exited. But a signal typed at
//! the terminal (Ctrl-C) already goes to CMD, which is in redlease's foreground process
//! group; passing it on again would deliver it twice, and many programs treat a second
//! Ctrl-C as "quit now, skip the cleanup". So a signal is passed on when another process
//! sent it (`kill`, `timeout`, a supervisor), which the kernel records in `si_code`: zero
//! or negative for signals sent by a process, positive for those the kernel (the
//! terminal driver) generated — or when CMD has left redlease's process group, so the
//! terminal's signal did not reach it.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// The signals redlease handles: SIGINT, SIGTERM, SIGHUP.
const HANDLED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Per handled signal: set by the low-level action when a process sent it.
static SENT_BY_PROCESS: [AtomicBool; 3] = [const { AtomicBool::new(false) }; 3];

/// A signal that arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    pub signal: Signal,
    /// Another process sent it (so CMD has not got it yet); `false` when the terminal did.
    pub sent_by_process: bool,
}

/// Catches SIGINT, SIGTERM and SIGHUP from creation until the process exits.
pub struct Signals {
    streams: [tokio::signal::unix::Signal; 3],
}

impl Signals {
    /// Starts catching the signals. Must be called inside the runtime.
    pub fn catch() -> std::io::Result<Signals> {
        for (i, sig) in HANDLED.iter().enumerate() {
            // SAFETY: the action only stores to an atomic, which is async-signal-safe,
            // and the signals are not among those signal-hook-registry forbids.
            unsafe {
                signal_hook_registry::register_sigaction(*sig as libc::c_int, move |info| {
                    if info.si_code <= 0 {
                        SENT_BY_PROCESS[i].store(true, Ordering::SeqCst);
                    }
                })?;
            }
        }
        Ok(Signals {
            streams: [
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
                signal(SignalKind::hangup())?,
            ],
        })
    }

    /// Waits for the next signal.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal that arrives while the future is not polled is reported by
    /// the next call.
    pub async fn recv(&mut self) -> Received {
        let [int, term, hup] = &mut self.streams;
        let i = tokio::select! {
            _ = int.recv() => 0,
            _ = term.recv() => 1,
            _ = hup.recv() => 2,
        };
        // Our action was registered before tokio's, and signal-hook-registry runs the
        // actions of one signal in registration order, so the flag is set before tokio
        // is told of the signal.
        Received {
            signal: HANDLED[i],
            sent_by_process: SENT_BY_PROCESS[i].swap(false, Ordering::SeqCst),
        }
    }
}
