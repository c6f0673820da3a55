//! The store seam, for redguard's own tests only (feature `test-util`). **Unstable**: not a
//! public API, it changes with any release; a documented, versioned seam for store
//! implementers may come later.
//!
//! `Store` is one trait of guard operations (each atomic, one round trip), taking the
//! request structs below; `RedisStore` and `MemoryStore` implement it and pass the same
//! conformance suite.

pub use crate::store::*;

use std::sync::Arc;

use crate::handle::Redguard;

/// The store behind `rg`.
pub fn of(rg: &Redguard) -> &Arc<dyn Store> {
    rg.store()
}

/// A handle on `store`, with default settings.
pub fn handle(store: impl Store) -> Redguard {
    Redguard::from_store(store)
}
