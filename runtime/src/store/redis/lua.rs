//! A Lua script as the store runs it: its SHA-1 for `EVALSHA`, and its source.
//!
//! The source is kept so that, with the `test-util` feature, tests can run the same script
//! with its clock pinned (`redis.call('TIME')` replaced by a time they choose) or with a
//! deliberate mutation, through `EVAL`. Production code only ever sends `EVALSHA` of the
//! unchanged script.

use std::ops::Deref;

use redis::Script;

pub(crate) struct Lua {
    script: Script,
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    source: &'static str,
}

impl Lua {
    pub(crate) fn new(source: &'static str) -> Lua {
        Lua {
            script: Script::new(source),
            source,
        }
    }

    #[cfg(feature = "test-util")]
    pub(crate) fn source(&self) -> &'static str {
        self.source
    }
}

impl Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

/// Declares `static $name: Lazy<Lua>` for `scripts/$file`, with the `scripts/$prelude` files
/// (functions several scripts share, such as `next_fence` in `fence.lua`) ahead of it: Redis
/// scripts cannot import one another, so the shared code is one file joined in at compile time.
macro_rules! lua {
    ($name:ident = $file:literal) => {
        static $name: once_cell::sync::Lazy<$crate::store::redis::lua::Lua> =
            once_cell::sync::Lazy::new(|| {
                $crate::store::redis::lua::Lua::new(include_str!(concat!("scripts/", $file)))
            });
    };
    ($name:ident = $file:literal after $($prelude:literal),+) => {
        static $name: once_cell::sync::Lazy<$crate::store::redis::lua::Lua> =
            once_cell::sync::Lazy::new(|| {
                $crate::store::redis::lua::Lua::new(concat!(
                    $(include_str!(concat!("scripts/", $prelude)),)+
                    include_str!(concat!("scripts/", $file))
                ))
            });
    };
}
pub(crate) use lua;
