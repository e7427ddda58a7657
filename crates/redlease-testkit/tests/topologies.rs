//! The kit's cluster and sentinel set-ups work and clean up after themselves.

use std::time::{Duration, Instant};

use redlease_testkit::{RedisCluster, RedisSentinel};

fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    cmd.query(&mut con).unwrap()
}

#[test]
fn a_cluster_starts_spreads_slots_and_migrates_one() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3, 0).unwrap();
    eprintln!("3-master cluster up in {:?}", started.elapsed());
    let key = cluster.key_on_master(1, |n| format!("kit-{n}")).unwrap();
    let slot = cluster.slot_of(&key).unwrap();
    assert_eq!(cluster.master_of_slot(slot).unwrap(), 1);
    let _: () = query(
        &cluster.master(1).url(),
        redis::cmd("SET").arg(&key).arg("v").arg("PX").arg(60_000),
    );
    let migration = cluster.begin_migration(slot, 2).unwrap();
    assert_eq!(cluster.migrate_keys(&migration).unwrap(), 1);
    cluster.finish_migration(&migration).unwrap();
    assert_eq!(cluster.master_of_slot(slot).unwrap(), 2);
    let v: Option<String> = query(&cluster.master(2).url(), redis::cmd("GET").arg(&key));
    assert_eq!(v.as_deref(), Some("v"));
    let ttl: i64 = query(&cluster.master(2).url(), redis::cmd("PTTL").arg(&key));
    assert!(ttl > 50_000, "the TTL moved with the key: {ttl}");
    cluster.wait_until_ok().unwrap();
}

#[test]
fn a_cluster_with_replicas_replicates() {
    let cluster = RedisCluster::start(3, 1).unwrap();
    assert_eq!(cluster.replicas().count(), 3);
    for (m, replica) in cluster.replicas() {
        let info: String = query(&replica.url(), redis::cmd("INFO").arg("replication"));
        assert!(info.contains("role:slave"), "{info}");
        assert!(
            info.contains(&format!("master_port:{}", cluster.master(m).port())),
            "{info}"
        );
    }
}

#[test]
fn sentinels_fail_over_when_the_master_dies() {
    let mut set = RedisSentinel::start().unwrap();
    let old = set.current_master().unwrap();
    assert_eq!(old, set.master().addr());
    set.master_mut().stop();
    let killed = Instant::now();
    let new = set.wait_for_failover(old, Duration::from_secs(30)).unwrap();
    eprintln!("failover to {new} took {:?}", killed.elapsed());
    assert_eq!(new, set.replicas()[0].addr());
}
