//! The global options, and connecting as they say: one server, a cluster, a master
//! found through sentinels, or Redlock's independent masters, with TLS when asked.
//! Combinations that cannot work are refused here, before anything is sent.

use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use crate::cli::{self, Cli, Command, TopologyArgs};
use crate::exit::{self, Failure};
use crate::output;

/// What every subcommand that talks to Redis needs.
#[derive(Clone)]
pub struct Global {
    /// Every `--redis` URL (cluster nodes with --cluster, masters with --redlock).
    pub urls: Vec<String>,
    /// The first of them: the one server of a plain set-up.
    pub url: String,
    /// `url` without its password, for messages.
    pub shown_url: String,
    /// `--redis` or `REDIS_URL` was given (not the default).
    pub url_given: bool,
    pub prefix: String,
    pub response_timeout: Duration,
    /// `--response-timeout` was given (not the default): with `--redlock` it bounds
    /// each master's request instead of the Redlock's own node timeout.
    pub response_timeout_given: bool,
    pub topology: TopologyArgs,
}

/// Parses the command line into the subcommand and the global options; exits with
/// status 2 on a usage error (clap's).
pub fn parse() -> (Command, Global) {
    // Parse by hand to learn whether --redis was given.
    let matches = Cli::command()
        .try_get_matches()
        .unwrap_or_else(|e| shown_safely(e).exit());
    let url_given = !matches!(matches.value_source("redis"), Some(ValueSource::DefaultValue));
    let response_timeout_given = !matches!(
        matches.value_source("response_timeout"),
        Some(ValueSource::DefaultValue) | None
    );
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| shown_safely(e).exit());
    let url = cli
        .redis
        .first()
        .cloned()
        .unwrap_or_else(|| cli::DEFAULT_URL.to_owned());
    let global = Global {
        // What messages name: the sentinels when they find the server, the URLs
        // otherwise; without passwords, and escaped.
        shown_url: if cli.topology.sentinel.is_empty() {
            &cli.redis
        } else {
            &cli.topology.sentinel
        }
        .iter()
        .map(|u| output::shown(&redlease::redact_url(u)))
        .collect::<Vec<_>>()
        .join(", "),
        urls: cli.redis,
        url,
        url_given,
        prefix: cli.prefix,
        response_timeout: cli.response_timeout,
        response_timeout_given,
        topology: cli.topology,
    };
    (cli.command, global)
}

/// A usage error whose quoted arguments — a rejected value, an unknown option — are
/// escaped and shortened (see [`output::shown`]): what was typed is echoed, but a
/// control character in it cannot rewrite the terminal, and a 10 KB value does not
/// fill it.
pub fn shown_safely(mut e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    let invalid = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => Some(arg.clone()),
        _ => None,
    };
    let quoted: Vec<_> = e
        .context()
        .filter_map(|(kind, value)| match value {
            ContextValue::String(s) => Some((kind, ContextValue::String(output::shown(s)))),
            ContextValue::Strings(v) => Some((
                kind,
                ContextValue::Strings(v.iter().map(|s| output::shown(s)).collect()),
            )),
            // Tips such as "to pass '--x' as a value, use '-- --x'" quote the input too.
            ContextValue::StyledStrs(v) => Some((
                kind,
                ContextValue::StyledStrs(
                    v.iter()
                        .map(|s| output::shown_long(&s.to_string()).into())
                        .collect(),
                ),
            )),
            _ => None,
        })
        .collect();
    for (kind, value) in quoted {
        e.insert(kind, value);
    }
    // clap's tip for a value that starts with '-' is to put it after '--', which for
    // `run` and `elect` is where CMD starts: a command that takes a NAME has --name.
    // (clap reports `-dash` as its first letter, `-d`: the tip names the whole word.)
    let takes_name = matches!(e.get(ContextKind::Usage), Some(ContextValue::StyledStr(u)) if u.to_string().contains("--name <NAME>"));
    if let (true, Some(arg)) = (takes_name, invalid)
        && arg.starts_with('-')
        && !arg.starts_with("--")
    {
        let word = std::env::args().find(|a| a.starts_with(&arg)).unwrap_or(arg);
        let tip = format!(
            "to give a NAME that starts with '-', use '--name={}'",
            output::shown(&word)
        );
        e.insert(ContextKind::Suggested, ContextValue::StyledStrs(vec![tip.into()]));
    }
    e
}

/// Refuses combinations of options and subcommands that cannot work, before anything
/// is sent (exit status 2).
pub fn check_topology(global: &Global, command: &Command) -> Result<(), Failure> {
    let t = &global.topology;
    let usage = |message: String| Err(Failure::new(exit::USAGE, message));
    if global.urls.len() > 1 && !t.cluster && !t.redlock {
        return usage(format!(
            "--redis was given {} times; several URLs need --cluster (cluster nodes) or --redlock (independent masters)",
            global.urls.len()
        ));
    }
    if t.redlock && global.urls.len() < 3 {
        return usage(format!(
            "--redlock needs at least 3 independent masters (--redis given {}); with fewer, one failure loses the majority",
            if global.urls.len() == 1 {
                "once".to_owned()
            } else {
                format!("{} times", global.urls.len())
            }
        ));
    }
    if !t.sentinel.is_empty() && global.url_given {
        return usage("--sentinel finds the master itself; leave out --redis (and REDIS_URL)".into());
    }
    let tls = t.tls_ca.is_some() || t.tls_cert.is_some();
    if tls && (t.cluster || !t.sentinel.is_empty()) {
        return usage("--tls-ca/--tls-cert work with one server or --redlock; for a TLS cluster or sentinel set-up use rediss:// URLs with certificates the system trusts".into());
    }
    let plain_mutex_only = |what: &str| -> Result<(), Failure> {
        let fine = match command {
            Command::Run(run) => !run.fair && !run.legacy,
            Command::Acquire(_) | Command::Release(_) | Command::Extend(_) => true,
            Command::Status(status) => !status.fair,
            _ => false,
        };
        if fine {
            Ok(())
        } else {
            Err(Failure::new(
                exit::USAGE,
                format!("{what} works with the plain lock only (run, acquire, release, extend, status)"),
            ))
        }
    };
    if t.wait_replicas.is_some() {
        plain_mutex_only("--wait-replicas")?;
        if t.redlock {
            return usage(
                "--wait-replicas and --redlock do not go together: Redlock's masters are independent".into(),
            );
        }
    }
    if t.redlock {
        match command {
            Command::Run(run) if !run.fair && !run.legacy => {}
            Command::Completions { .. } | Command::Man { .. } => {}
            _ => {
                return usage(
                    "with --redlock only `run` (without --fair or --legacy) is available: the other commands act on one server's keys".into(),
                );
            }
        }
    }
    if matches!(command, Command::Demo(_)) && (t.cluster || t.redlock || !t.sentinel.is_empty()) {
        return usage(
            "the demo runs on one plain Redis; leave out --cluster, --redlock and --sentinel".into(),
        );
    }
    Ok(())
}

/// The `redis::Client` for one URL, with the TLS options when given.
fn redis_client(global: &Global, url: &str) -> Result<redis::Client, Failure> {
    let t = &global.topology;
    let bad_url = |e: &dyn std::fmt::Display| {
        Failure::new(
            exit::USAGE,
            format!("invalid --redis URL {:?}: {e}", redlease::redact_url(url)),
        )
        .hint(format!(
            "pass --redis (or set REDIS_URL) to a URL such as {}",
            cli::DEFAULT_URL
        ))
    };
    if t.tls_ca.is_none() && t.tls_cert.is_none() {
        return redis::Client::open(url).map_err(|e| bad_url(&e));
    }
    let mut tls = redlease::TlsOptions::new();
    if let Some(ca) = &t.tls_ca {
        tls = tls.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&t.tls_cert, &t.tls_key) {
        tls = tls.cert_file(cert).key_file(key);
    }
    tls.redis_client(url).map_err(|e| {
        Failure::caused(exit::USAGE, e)
            .hint("--tls-ca, --tls-cert and --tls-key need a rediss:// URL and readable PEM files")
    })
}

/// Connects to Redis as `global` says: one server, a cluster, or a master found
/// through sentinels. (Redlock: [`connect_redlock`].)
pub async fn connect(global: &Global) -> Result<redlease::Client, Failure> {
    let t = &global.topology;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let builder = if t.cluster {
        redlease::Client::cluster_builder(global.urls.iter().map(String::as_str)).map_err(lock_err)?
    } else if let Some(master) = &t.master {
        redlease::Client::sentinel_builder(t.sentinel.iter().map(String::as_str), master).map_err(lock_err)?
    } else {
        redlease::Client::builder(redis_client(global, &global.url)?)
    };
    builder
        .prefix(global.prefix.clone())
        .response_timeout(Some(global.response_timeout))
        .build()
        .await
        .map_err(lock_err)
}

/// Connects to the independent masters of `--redlock`.
pub async fn connect_redlock(global: &Global) -> Result<redlease::Redlock, Failure> {
    let masters = global
        .urls
        .iter()
        .map(|url| redis_client(global, url))
        .collect::<Result<Vec<_>, _>>()?;
    let prefix = global.prefix.clone();
    let redlock = redlease::Redlock::connect_with(masters, move |b| b.prefix(prefix.clone()))
        .await
        .map_err(|e| Failure::from_lock(e, &global.shown_url))?;
    // Each master's request is bounded by the node timeout (at most a tenth of the
    // TTL), not by a connection's reply timeout.
    Ok(if global.response_timeout_given {
        redlock.node_timeout(global.response_timeout)
    } else {
        redlock
    })
}

/// The lease options of a plain lock: the TTL, and the replica policy of
/// `--wait-replicas`.
pub fn lease_options(global: &Global, ttl: Duration) -> redlease::LeaseOptions {
    let mut options = redlease::LeaseOptions::new().ttl(ttl);
    if let Some(k) = global.topology.wait_replicas {
        options = options.replica_ack(redlease::ReplicaAck::new(k).timeout(global.topology.replica_timeout));
    }
    options
}

/// Lets background work finish before the process exits: a release started by a
/// cancelled acquire (so no lock is left behind when redlease is interrupted while
/// waiting), and the clients' own shutdown. Every client must have been dropped;
/// bounded, so a dead server cannot hold redlease up.
pub async fn finish_background_work(response_timeout: Duration) {
    let bound = response_timeout.saturating_add(Duration::from_secs(1));
    let deadline = crate::wait::after(tokio::time::Instant::now(), bound);
    let metrics = tokio::runtime::Handle::current().metrics();
    while metrics.num_alive_tasks() > 0 && deadline.is_none_or(|d| tokio::time::Instant::now() < d) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
