//! `redlease-election`: the library's leader election. Every critical section is one
//! term: a candidate campaigns, leads for the section, and resigns; the term is the
//! fencing token the resource enforces. What the faults test besides the lease is the
//! election's own path — wake-ups of waiting candidates by a resignation, and terms
//! that keep rising across leaders.

use std::sync::Arc;
use std::time::Duration;

use redlease::{Client, Election, LeaseOptions};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, Role, acquire_error, redlease_client,
};
use crate::faults::Fault;

pub struct RedleaseElection;

impl Algorithm for RedleaseElection {
    fn name(&self) -> &'static str {
        "redlease-election"
    }

    fn describe(&self) -> &'static str {
        "redlease::Election: leaders take turns (campaign, lead, resign); the resource enforces the term as the fencing token"
    }

    fn fenced(&self) -> bool {
        true
    }

    fn must_be_safe(&self) -> bool {
        true
    }

    fn supports(&self, fault: Fault) -> bool {
        fault != Fault::Clock
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let elections = env
                .names
                .iter()
                .map(|name| client.election_with(name, LeaseOptions::new().ttl(env.ttl)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(ElectionClient {
                value: env.label.clone(),
                _client: client,
                elections,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct ElectionClient {
    _client: Client,
    elections: Vec<Election>,
    /// What a leader publishes: its client's label.
    value: String,
    timeout: Duration,
}

impl LockClient for ElectionClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            match self.elections[lock]
                .campaign_timeout(&self.value, self.timeout)
                .await
            {
                Ok(leadership) => Ok(Held::guard(leadership, Role::Writer)),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}
