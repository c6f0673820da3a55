//! The guide: how each guard behaves, how to configure, serve, operate and test it.
//!
//! Each page below is a module with nothing but documentation; its examples are compiled (and
//! most are run) by `cargo test`, so they stay true to the API they show.
//!
//! | page | what it covers |
//! |---|---|
//! | [`idempotency`] | `#[idempotent]`: records, error classes, replays, tokens, the runtime API |
//! | [`keys`] | key templates, scopes, and the rules every value in a key must follow |
//! | [`locks`] | `#[dist_lock]`: leases, fencing tokens, waiting, kinds (read/write, fair, semaphores) |
//! | [`rate_limits`] | `#[rate_limit]`: algorithms, stacked limits, precision, `block`, `wait`, `local` |
//! | [`failures`] | what each guard does when Redis is slow or gone; replica-safe writes |
//! | [`configuration`] | the handle's settings, the environment, Cargo features |
//! | [`http`] | `RateLimitLayer`, `IdempotencyLayer`, the status table (feature `axum`) |
//! | [`servers`] | supported servers, Redis Cluster, Sentinel, TLS, restricted ACL users |
//! | [`operations`] | metrics, traces, and the `redguard` tool that reads and repairs guard state |
//! | [`testing`] | testing your own code on the memory store, with a clock you move |
//! | [`recipes`] | an order endpoint with every guard: the `Idempotency-Key` header, a rate limit, the lock and its fence, the outcome in your transaction |

pub mod idempotency {
    #![doc = include_str!("../docs/idempotency.md")]
}

pub mod keys {
    #![doc = include_str!("../docs/keys.md")]
}

pub mod locks {
    #![doc = include_str!("../docs/locks.md")]
}

pub mod rate_limits {
    #![doc = include_str!("../docs/rate_limits.md")]
}

pub mod failures {
    #![doc = include_str!("../docs/failures.md")]
}

pub mod configuration {
    #![doc = include_str!("../docs/configuration.md")]
}

// Its examples build axum routers: without the feature the page says where it is.
pub mod http {
    #![cfg_attr(feature = "axum", doc = include_str!("../docs/http.md"))]
    #![cfg_attr(
        not(feature = "axum"),
        doc = "The HTTP layers and this page need the `axum` feature (docs.rs builds with every feature)."
    )]
}

pub mod servers {
    #![doc = include_str!("../docs/servers.md")]
}

pub mod operations {
    #![doc = include_str!("../docs/operations.md")]
}

pub mod testing {
    #![doc = include_str!("../docs/testing.md")]
}

// Its example is an axum handler on Postgres (SQLite beside it): without the features the page
// says which it needs.
pub mod recipes {
    #![cfg_attr(
        all(feature = "axum", feature = "sqlx-postgres", feature = "sqlx-sqlite"),
        doc = include_str!("../docs/recipes.md")
    )]
    #![cfg_attr(
        not(all(feature = "axum", feature = "sqlx-postgres", feature = "sqlx-sqlite")),
        doc = "This recipe needs the `axum`, `sqlx-postgres` and `sqlx-sqlite` features (docs.rs builds with every feature)."
    )]
}
