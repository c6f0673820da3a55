//! The integration tests, one module per area, in one binary (linking one test binary
//! instead of one per file). Tests that set process-wide state (the installed default
//! handle, the global metrics recorder) are in `tests/global/`, a binary of their own.

mod admin;
mod admin_races;
mod cancellation_guards;
mod cancellation_locks;
mod cluster_failover;
mod conformance;
mod conformance_idem;
mod conformance_lock;
mod conformance_rate;
mod faults;
mod histories;
mod http_layers;
mod idempotency_faults;
mod idempotent_processes;
mod idempotent_redis;
mod key_injection;
mod lock_behaviour;
mod lock_cancellation;
mod lock_processes;
mod lock_safety;
mod lock_slow_network;
mod memory_store;
mod metrics;
mod models;
mod pinned_clock;
mod rate_accuracy;
mod rate_boundary;
mod rate_coalescing;
mod rate_gcra_model;
mod rate_limit_attr;
mod rate_precision;
mod rate_sliding_log;
mod rate_throughput;
mod redis_store;
mod replicas;
mod scopes;
mod security;
mod sentinel;
mod spans;
mod stacking;
