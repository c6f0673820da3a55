//! Without the `test-util` feature (this crate does not enable it), a clock on a Redis
//! builder is a configuration error: Redis brings its own clock.

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let refused = redguard::Redguard::redis("redis://127.0.0.1:1/")
        .clock(redguard::clock::ManualClock::new())
        .connect()
        .await;
    assert!(
        matches!(refused, Err(redguard::Error::Config(_))),
        "{refused:?}"
    );
}
