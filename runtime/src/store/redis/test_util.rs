//! Test-only hooks (the `test-util` feature): scripts run on a pinned clock, or mutated.
//!
//! Redis has no virtual clock, so a test comparing the scripts with a reference model (exact
//! decisions, not within a tolerance) pins the one time source the scripts have: every
//! `redis.call('TIME')` is replaced by the time of a [`Clock`] the test moves. Mutation tests
//! rewrite a script's source. Either way the script goes out as `EVAL` of the changed text;
//! without the feature, nothing here exists and only `EVALSHA` of the shipped scripts is sent.

use std::fmt;
use std::sync::Arc;

use super::lua::Lua;
use crate::clock::Clock;

/// A rewrite of a script's source, given the source.
pub(crate) type Transform = Arc<dyn Fn(&str) -> String + Send + Sync>;

#[derive(Clone, Default)]
pub(crate) struct TestHooks {
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) transform: Option<Transform>,
}

impl fmt::Debug for TestHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestHooks")
            .field("clock", &self.clock)
            .field("transform", &self.transform.is_some())
            .finish()
    }
}

impl TestHooks {
    /// `cmd` (an `EVALSHA` of `script`), or the same call as an `EVAL` of the rewritten script.
    pub(crate) fn rewrite(&self, script: &Lua, cmd: redis::Cmd) -> redis::Cmd {
        if self.clock.is_none() && self.transform.is_none() {
            return cmd;
        }
        let mut source = match &self.transform {
            Some(transform) => transform(script.source()),
            None => script.source().to_owned(),
        };
        if let Some(clock) = &self.clock {
            let now = clock.now();
            let pinned = format!("{{'{}', '{}'}}", now.as_secs(), now.subsec_micros());
            source = source.replace("redis.call('TIME')", &pinned);
        }
        let mut eval = redis::cmd("EVAL");
        eval.arg(source);
        // Past `EVALSHA <sha>`: the key count, keys and arguments, unchanged.
        for arg in cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}
