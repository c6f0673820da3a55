//! The process-wide handle: one test, because installing is once per process.

use std::time::Duration;

use redguard::{Error, Redguard};

#[tokio::test]
async fn guards_need_an_installed_handle_and_install_happens_once() {
    let before = redguard::tokens().issue("a", Duration::from_secs(60)).await;
    match before {
        Err(err @ Error::NotInstalled) => {
            assert!(err.to_string().contains("install()"), "{err}");
        }
        other => panic!("expected NotInstalled, got {other:?}"),
    }

    let scoped = Redguard::memory();
    let token = scoped
        .scope(redguard::tokens().issue("a", Duration::from_secs(60)))
        .await
        .unwrap();
    // Scoped handles do not leak out of their future.
    assert!(matches!(
        redguard::tokens().consume("a", &token).await,
        Err(Error::NotInstalled)
    ));

    let installed = Redguard::memory().install().unwrap();
    let token = redguard::tokens()
        .issue("a", Duration::from_secs(60))
        .await
        .unwrap();
    installed.tokens().consume("a", &token).await.unwrap();

    let again = Redguard::memory().install();
    assert!(matches!(again, Err(Error::Config(_))), "{again:?}");
}
