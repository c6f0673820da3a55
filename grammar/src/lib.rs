//! The grammar and bounds of [redguard](https://docs.rs/redguard)'s settings: durations
//! (`"300ms"`), rates (`"100/s"`), and the limits every guard setting must respect.
//!
//! One definition for both sides: the attribute macros check literals with these functions at
//! compile time, the runtime checks values from expressions and configuration with the same
//! ones, so a literal the runtime would refuse cannot compile. No dependencies, no guard logic:
//! numbers in, a value or a message out.

pub mod duration;
pub mod idempotency;
pub mod lock;
pub mod rate;
pub mod replicas;
pub mod tokens;
