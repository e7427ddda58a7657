//! The protected resource: counters that every critical section reads and increments,
//! served over TCP by the coordinator process and never subjected to faults.
//!
//! Each access carries the accessor's fencing token. A *fenced* counter refuses any
//! access — read or write — whose token is lower than the highest it has accepted
//! (Kleppmann's fencing; fencing only writes would still let a stale holder's read
//! feed a later write). An *unfenced* counter, used by the baselines, accepts all.
//!
//! Holders that do not modify the counter — a read-write lock's readers, a semaphore's
//! permit holders — have no token. They announce where their critical section begins
//! and ends (`B`, then `E`, or `L` when they leave early because their lease was lost);
//! those accesses are never fenced, only logged (and `B`/`E` return the value), so the
//! checker can see who was inside at once.
//!
//! Every access, accepted or refused, is appended to the counter's log under the same
//! lock that applies it, with the time it was applied. The log — not what clients
//! believe happened — is what the checker audits.
//!
//! Protocol: one line per request, one line per reply.
//!
//! ```text
//! R <counter> <cs> <token> <valid_until_ns>          -> OK <value> <at_ns> | STALE <max> <at_ns>
//! W <counter> <cs> <token> <value> <valid_until_ns>  -> OK <value> <at_ns> | STALE <max> <at_ns>
//! B|E|L <counter> <cs> <valid_until_ns>              -> OK <value> <at_ns>
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::clock::mono_ns;

/// What an access does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Reads the value (fenced): the start of a read-increment-write.
    Read,
    /// Writes a value (fenced): completes a read-increment-write.
    Write,
    /// A tokenless holder (reader, permit holder) enters; reads the value.
    Begin,
    /// ... completes its critical section and leaves; reads the value.
    End,
    /// ... leaves early, its lease lost: not a completed critical section.
    Leave,
}

impl Op {
    /// Whether the fencing rule applies (and the token counts).
    pub fn fenced(self) -> bool {
        matches!(self, Op::Read | Op::Write)
    }

    /// Whether an accepted access of this kind completes a critical section.
    pub fn completes(self) -> bool {
        matches!(self, Op::Write | Op::End)
    }
}

/// One access as the resource applied (or refused) it.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// The critical section it belongs to.
    pub cs: u64,
    pub token: u64,
    pub op: Op,
    /// The value read, or the value written.
    pub value: u64,
    /// The counter's value before a write.
    pub before: u64,
    pub accepted: bool,
    /// When the resource applied or refused it.
    pub at_ns: u64,
    /// Until when the accessor's lease was valid by its own clock when it sent the
    /// request (0: no lease).
    pub valid_until_ns: u64,
}

/// A counter and everything that happened to it.
#[derive(Debug, Default)]
pub struct CounterLog {
    pub fenced: bool,
    pub value: u64,
    pub max_token: u64,
    pub accesses: Vec<Access>,
    /// Every rise of `max_token`: `(at_ns, new max)`, both increasing.
    pub raises: Vec<(u64, u64)>,
}

impl CounterLog {
    fn apply(
        &mut self,
        cs: u64,
        token: u64,
        op: Op,
        write: Option<u64>,
        valid_until_ns: u64,
    ) -> (bool, u64, u64) {
        let at_ns = mono_ns();
        let accepted = !self.fenced || !op.fenced() || token >= self.max_token;
        if accepted && op.fenced() && token > self.max_token {
            self.max_token = token;
            self.raises.push((at_ns, token));
        }
        let before = self.value;
        if accepted && let Some(v) = write {
            self.value = v;
        }
        self.accesses.push(Access {
            cs,
            token,
            op,
            value: write.unwrap_or(before),
            before,
            accepted,
            at_ns,
            valid_until_ns,
        });
        (
            accepted,
            if accepted { self.value } else { self.max_token },
            at_ns,
        )
    }
}

type State = Arc<Mutex<Vec<CounterLog>>>;

/// The resource server.
pub struct Resource {
    state: State,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Resource {
    /// Listens on a free loopback port. Must run inside the coordinator's runtime.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state: State = Arc::default();
        let task = tokio::spawn(accept_loop(listener, state.clone()));
        Ok(Resource { state, addr, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts a phase: fresh counters, fenced or not.
    pub fn reset(&self, fenced: &[bool]) {
        let mut state = self.state.lock().expect("resource lock");
        *state = fenced
            .iter()
            .map(|&fenced| CounterLog {
                fenced,
                ..CounterLog::default()
            })
            .collect();
    }

    /// Ends a phase: hands over the counters and their logs.
    pub fn take(&self) -> Vec<CounterLog> {
        std::mem::take(&mut *self.state.lock().expect("resource lock"))
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: State) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve(stream, state.clone()));
    }
}

async fn serve(stream: TcpStream, state: State) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = match handle(&line, &state) {
            Ok((true, value, at)) => format!("OK {value} {at}\n"),
            Ok((false, max, at)) => format!("STALE {max} {at}\n"),
            Err(e) => format!("ERR {e}\n"),
        };
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn handle(line: &str, state: &State) -> Result<(bool, u64, u64), String> {
    let mut parts = line.split_ascii_whitespace();
    let op = parts.next().unwrap_or("");
    let mut num = || -> Result<u64, String> {
        parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("bad request {line:?}"))
    };
    let op = match op {
        "R" => Op::Read,
        "W" => Op::Write,
        "B" => Op::Begin,
        "E" => Op::End,
        "L" => Op::Leave,
        _ => return Err(format!("bad request {line:?}")),
    };
    let counter = num()? as usize;
    let cs = num()?;
    let token = if op.fenced() { num()? } else { 0 };
    let write = if op == Op::Write { Some(num()?) } else { None };
    let valid_until = num()?;
    let mut state = state.lock().expect("resource lock");
    let log = state
        .get_mut(counter)
        .ok_or_else(|| format!("no counter {counter}"))?;
    Ok(log.apply(cs, token, op, write, valid_until))
}

/// What the resource answered.
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    Accepted { value: u64 },
    Stale { at_ns: u64 },
}

/// One client's connection to the resource.
pub struct ResourceConn {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
    counter: usize,
}

impl ResourceConn {
    pub async fn connect(addr: &str, counter: usize) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        Ok(ResourceConn {
            lines: BufReader::new(read).lines(),
            write,
            counter,
        })
    }

    pub async fn read(&mut self, cs: u64, token: u64, valid_until_ns: u64) -> std::io::Result<Reply> {
        let c = self.counter;
        self.call(format!("R {c} {cs} {token} {valid_until_ns}\n")).await
    }

    pub async fn write(
        &mut self,
        cs: u64,
        token: u64,
        value: u64,
        valid_until_ns: u64,
    ) -> std::io::Result<Reply> {
        let c = self.counter;
        self.call(format!("W {c} {cs} {token} {value} {valid_until_ns}\n"))
            .await
    }

    /// A tokenless access (`Begin`, `End` or `Leave`): never fenced.
    pub async fn mark(&mut self, op: Op, cs: u64, valid_until_ns: u64) -> std::io::Result<Reply> {
        let c = self.counter;
        let code = match op {
            Op::Begin => "B",
            Op::End => "E",
            Op::Leave => "L",
            Op::Read | Op::Write => return Err(std::io::Error::other("a fenced access needs a token")),
        };
        self.call(format!("{code} {c} {cs} {valid_until_ns}\n")).await
    }

    async fn call(&mut self, request: String) -> std::io::Result<Reply> {
        self.write.write_all(request.as_bytes()).await?;
        let line = self
            .lines
            .next_line()
            .await?
            .ok_or_else(|| std::io::Error::other("the resource closed the connection"))?;
        let bad = || std::io::Error::other(format!("bad reply from the resource: {line:?}"));
        let mut parts = line.split_ascii_whitespace();
        let kind = parts.next().ok_or_else(bad)?;
        let mut num = || parts.next().and_then(|p| p.parse::<u64>().ok()).ok_or_else(bad);
        match kind {
            "OK" => Ok(Reply::Accepted { value: num()? }),
            "STALE" => {
                let _max = num()?;
                Ok(Reply::Stale { at_ns: num()? })
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_counter_refuses_lower_tokens_on_reads_and_writes() {
        let mut c = CounterLog {
            fenced: true,
            ..CounterLog::default()
        };
        assert!(c.apply(1, 10, Op::Read, None, 0).0);
        assert!(c.apply(2, 11, Op::Read, None, 0).0);
        // The older holder may neither read nor write any more.
        assert_eq!(
            c.apply(1, 10, Op::Read, None, 0),
            (false, 11, c.accesses[2].at_ns)
        );
        assert!(!c.apply(1, 10, Op::Write, Some(1), 0).0);
        assert_eq!(c.value, 0, "the refused write changed nothing");
        assert!(c.apply(2, 11, Op::Write, Some(1), 0).0);
        assert_eq!(c.value, 1);
        assert_eq!(c.raises.iter().map(|&(_, m)| m).collect::<Vec<_>>(), [10, 11]);
        assert_eq!(c.accesses.iter().filter(|a| !a.accepted).count(), 2);
    }

    #[test]
    fn tokenless_marks_pass_a_fenced_counter_and_never_raise_its_token() {
        let mut c = CounterLog {
            fenced: true,
            ..CounterLog::default()
        };
        assert!(c.apply(1, 10, Op::Read, None, 0).0);
        assert!(c.apply(2, 0, Op::Begin, None, 0).0);
        assert!(c.apply(2, 0, Op::End, None, 0).0);
        assert!(c.apply(3, 0, Op::Leave, None, 0).0);
        assert_eq!(c.max_token, 10);
        assert_eq!(c.raises.len(), 1);
        assert!(
            c.apply(1, 10, Op::Write, Some(1), 0).0,
            "the writer is still the newest"
        );
    }

    #[test]
    fn an_unfenced_counter_accepts_everything_and_still_logs_it() {
        let mut c = CounterLog::default();
        assert!(c.apply(1, 0, Op::Read, None, 0).0);
        assert!(c.apply(2, 0, Op::Read, None, 0).0);
        assert!(c.apply(1, 0, Op::Write, Some(1), 0).0);
        assert!(c.apply(2, 0, Op::Write, Some(1), 0).0);
        assert_eq!(c.value, 1, "the lost update happened");
        assert_eq!(c.accesses.len(), 4);
        assert_eq!((c.accesses[3].before, c.accesses[3].value), (1, 1));
    }
}
