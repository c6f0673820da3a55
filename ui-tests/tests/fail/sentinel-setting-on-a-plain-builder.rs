// Sentinel-only settings exist on the builder `Redguard::redis_sentinel` returns, not on a
// single node's (or a Cluster's), which takes credentials in its URL.
fn main() {
    let _ = redguard::Redguard::redis("redis://127.0.0.1:6379").sentinel_auth("watcher", "s3");
}
