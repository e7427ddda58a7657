//! Expose redlease's metrics in the Prometheus text format: install a recorder, take a
//! few locks, print what a scrape would read.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example metrics
//! ```
//!
//! A service would serve `handle.render()` on its `/metrics` endpoint (or let
//! `metrics-exporter-prometheus` listen itself, with its `http-listener` feature) and
//! call `handle.run_upkeep()` every few seconds.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Histograms as Prometheus histograms, with buckets from 0.5 ms to 15 min: waits
    // are often sub-millisecond, holds can last minutes.
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        300.0, 900.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)?
        .install_recorder()?;
    // Units and help text, for the `# HELP` lines.
    redlease::describe_metrics();

    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redlease::Client::connect(&url).await?;
    let other = redlease::Client::connect(&url).await?;
    let mutex = client.mutex("examples:metrics")?;

    for _ in 0..3 {
        let guard = mutex.lock_timeout(Duration::from_secs(5)).await?;
        guard.release().await?;
    }
    let guard = mutex.lock_timeout(Duration::from_secs(5)).await?;
    // Another client finds it taken, then gives up waiting.
    let busy = other.mutex("examples:metrics")?;
    assert!(busy.try_lock().await.is_err_and(|e| e.is_contended()));
    assert!(
        busy.lock_timeout(Duration::from_millis(50))
            .await
            .is_err_and(|e| e.is_timeout())
    );
    guard.release().await?;

    let text = handle.render();
    print!("{text}");

    // What the calls above must have recorded.
    for line in [
        r#"redlease_acquisitions_total{primitive="mutex",outcome="acquired"} 4"#,
        r#"redlease_acquisitions_total{primitive="mutex",outcome="contended"} 1"#,
        r#"redlease_acquisitions_total{primitive="mutex",outcome="timeout"} 1"#,
        r#"redlease_hold_seconds_count{primitive="mutex"} 4"#,
        "# TYPE redlease_acquire_wait_seconds histogram",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing from the exposition: {line}"
        );
    }
    Ok(())
}
