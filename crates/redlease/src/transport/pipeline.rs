//! Pipelines: sending commands together over one connection, grouping them (by slot,
//! by node) and putting the answers back in order — what every way of batching uses.

use redis::{Cmd, ErrorKind, RedisResult, Value};

use super::CommandConnection;

/// Sends `cmds` in one pipeline over `conn`; every command fails alike when the
/// pipeline as a whole does.
pub(crate) async fn one_pipeline(conn: &dyn CommandConnection, cmds: &[Cmd]) -> Vec<RedisResult<Value>> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for cmd in cmds {
        pipe.add_command(cmd.clone());
    }
    match conn.send_pipeline(&pipe).await {
        Ok(results) if results.len() == cmds.len() => results,
        Ok(results) => {
            let err = redis::RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "pipeline reply count mismatch",
                format!("{} replies for {} commands", results.len(), cmds.len()),
            ));
            vec![Err(err); cmds.len()]
        }
        Err(e) => vec![Err(e); cmds.len()],
    }
}

/// The indices of `items`, grouped by `key` in order of first appearance.
pub(crate) fn group_by<T, K: Eq + std::hash::Hash>(items: &[T], key: impl Fn(&T) -> K) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index: std::collections::HashMap<K, usize> = std::collections::HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let g = *index.entry(key(item)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// Puts the answers of each group back in the order of the original commands.
pub(crate) fn scatter(
    len: usize,
    groups: &[Vec<usize>],
    answers: Vec<Vec<RedisResult<Value>>>,
) -> Vec<RedisResult<Value>> {
    let mut results: Vec<Option<RedisResult<Value>>> = (0..len).map(|_| None).collect();
    for (members, answer) in groups.iter().zip(answers) {
        for (&i, result) in members.iter().zip(answer) {
            results[i] = Some(result);
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(redis::RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "no reply for a command of the batch",
                )))
            })
        })
        .collect()
}

/// The Redis Cluster slot of `key`: CRC16/XMODEM of its hash tag (or of the whole key),
/// modulo 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(close) if close > 0 => &key[open + 1..open + 1 + close],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // The examples of Redis's CLUSTER KEYSLOT documentation.
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // And redis-rs's own routing, for a spread of keys.
        for i in 0..1000 {
            let key = format!("redlease:lock-{i}");
            let theirs = format!("{:?}", redis::cluster_routing::Slot::for_key(&key));
            assert_eq!(theirs, format!("Slot({})", key_slot(key.as_bytes())));
        }
        // An empty tag hashes the whole key.
        assert_ne!(key_slot(b"a{}b"), key_slot(b""));
    }

    #[test]
    fn groups_keep_first_appearance_order_and_scatter_restores_it() {
        let groups = group_by(&[3, 1, 3, 2, 1], |x| *x);
        assert_eq!(groups, vec![vec![0, 2], vec![1, 4], vec![3]]);
        let answers = groups
            .iter()
            .map(|g| g.iter().map(|&i| Ok(Value::Int(i as i64))).collect())
            .collect();
        let results = scatter(5, &groups, answers);
        let ints: Vec<i64> = results
            .into_iter()
            .map(|r| match r.unwrap() {
                Value::Int(i) => i,
                _ => -1,
            })
            .collect();
        assert_eq!(ints, vec![0, 1, 2, 3, 4]);
    }
}
