//! The Lua scripts the model mirrors, each with a hash of the contents the model was
//! last reviewed against. The test `scripts_match_the_model` (`tests/scripts.rs`) fails
//! when a script changes: review the model step named beside it, then record the new
//! hash the failure prints — one line per script.

/// A mirrored script: its file in `crates/redlease/src/script/`, its contents, the
/// FNV-1a hash of the contents the model was reviewed against, and the model step
/// that mirrors it.
pub struct Mirrored {
    pub file: &'static str,
    pub contents: &'static str,
    pub reviewed: u64,
    pub step: &'static str,
}

macro_rules! mirrored {
    ($file:literal, $reviewed:literal, $step:literal) => {
        Mirrored {
            file: $file,
            contents: include_str!(concat!("../../redlease/src/script/", $file)),
            reviewed: $reviewed,
            step: $step,
        }
    };
}

/// Every script the model mirrors, with the hash it was reviewed at.
pub const MIRRORED: &[Mirrored] = &[
    mirrored!(
        "mark.lua",
        0xc2f7ccfcd03159c8,
        "server.rs: Server::take_fence, pipelined_incr, fence_mark"
    ),
    mirrored!(
        "mutex_acquire.lua",
        0xd7248540a57d9fdc,
        "server.rs: Server::mutex_acquire, set_nx"
    ),
    mirrored!(
        "mutex_release.lua",
        0x11031cea87e8e94a,
        "server.rs: Server::mutex_release, free_or_hand_over (a first waiter of kind '!' is only woken)"
    ),
    mirrored!(
        "mutex_extend.lua",
        0x818dfb668a6c5ea3,
        "server.rs: Server::extend (Kind::Mutex)"
    ),
    mirrored!(
        "mutex_handoff.lua",
        0x4417b9b2f80a6077,
        "server.rs: Server::handoff"
    ),
    mirrored!(
        "sem_handoff.lua",
        0xd2995cc7e57951f3,
        "server.rs: Server::sem_handoff"
    ),
    mirrored!(
        "multi_acquire.lua",
        0x548d62f48f9a4afa,
        "server.rs: Server::multi_acquire"
    ),
    mirrored!(
        "multi_extend.lua",
        0x49dd311d590401d1,
        "server.rs: Server::extend (Lock::Multi)"
    ),
    mirrored!(
        "multi_release.lua",
        0x6042ab46b2be707a,
        "server.rs: Server::multi_release, mutex_release, free_or_hand_over"
    ),
    mirrored!(
        "expiry.lua",
        0xaa7bce6883a3bcaf,
        "server.rs: Server::tick (permit deadlines), Server::extend (Kind::Semaphore)"
    ),
    mirrored!(
        "sem_acquire.lua",
        0x5e2f6b4d586ad93b,
        "server.rs: Server::sem_acquire"
    ),
    mirrored!(
        "sem_extend.lua",
        0x7ec75f2eb01005f6,
        "server.rs: Server::extend (Kind::Semaphore)"
    ),
    mirrored!(
        "sem_release.lua",
        0x5944c832255d1cd9,
        "server.rs: Server::release (Kind::Semaphore)"
    ),
    mirrored!(
        "sem_waiters.lua",
        0x0873d50350e7d26c,
        "server.rs: Server::sem_hand_out"
    ),
    mirrored!(
        "fence.lua",
        0xa460229c5f970b31,
        "server.rs: Server::election_campaign (next_fence)"
    ),
    mirrored!(
        "election_campaign.lua",
        0xe51154a1b94ef381,
        "server.rs: Server::election_campaign"
    ),
    mirrored!(
        "election_renew.lua",
        0x3efde686660f5aed,
        "server.rs: Server::extend (Kind::Election)"
    ),
    mirrored!(
        "election_resign.lua",
        0xcd1974d91f4876e6,
        "server.rs: Server::release (Kind::Election)"
    ),
];

/// FNV-1a, 64 bits: a hash whose value never changes between Rust releases (std's
/// `DefaultHasher` may).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_values() {
        // From the FNV reference test suite.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
