//! Everything macro expansions name. Not a public API: it changes with the macros, which are
//! pinned to this crate's exact version.

pub use crate::handle::Redguard;
pub use crate::key::{KeyBuilder, KeyPart};

/// Identity on a `KeyPart`: expansions call it at each placeholder's span, so a value of the
/// wrong type is reported there.
#[inline(always)]
pub fn key_part<T: KeyPart + ?Sized>(value: &T) -> &T {
    value
}
