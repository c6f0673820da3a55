//! Redis's own figures for a script, from `redis-benchmark` in the same run.

/// `redis-benchmark` running `EVALSHA <sha> <args>` with `clients` connections and
/// `pipeline` commands in flight per connection; requests per second.
pub(crate) fn redis_benchmark(
    port: u16,
    clients: usize,
    pipeline: usize,
    requests: usize,
    args: &[String],
) -> Option<f64> {
    let output = crate::on_load_core("redis-benchmark")
        .args(["-p", &port.to_string()])
        .args(["-c", &clients.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-n", &requests.to_string()])
        .args(["-r", "1000000"])
        .args(["--csv"])
        .args(args)
        .output()
        .ok()?;
    // --csv prints a header line, then "name","rps",...
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter_map(|line| line.split(',').nth(1))
        .filter_map(|field| field.trim_matches('"').parse::<f64>().ok())
        .next_back()
}
