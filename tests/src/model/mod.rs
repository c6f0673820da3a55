//! Reference models of the guards, written from the guide (`runtime/docs`) and DESIGN.md (not
//! from the stores): small pure state machines over a virtual clock, so a property test can run the
//! same operations on a model and on every store and compare the answers exactly.
//!
//! Times are µs since the Unix epoch (the store clock's resolution). An entry with a TTL
//! lives while `now < expires_at`: at its expiry instant it is gone, as on the in-memory
//! store (the Redis harness expires keys the same way, see [`crate::vclock`]).

pub mod http;
pub mod idem;
pub mod lock;
pub mod rate;
pub mod token;
