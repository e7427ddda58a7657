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

#[cfg(test)]
mod tests {
    use super::*;

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
