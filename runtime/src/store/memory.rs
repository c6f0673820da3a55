//! [`Store`] in process memory: the embedded default for a single instance and for users'
//! own tests.
//!
//! One mutex guards a map of entries; every entry carries an expiry, indexed in a `BTreeSet`
//! so expired entries are dropped in order as time passes instead of lingering until touched.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{Store, StoreKind, TokenOutcome};
use crate::clock::{Clock, SystemClock};
use crate::error::Result;
use crate::key::Key;

/// The in-process [`Store`]. Safe for one instance only: nothing is shared between processes.
///
/// Runs on the system clock, or on a [`ManualClock`](crate::ManualClock) that tests advance:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
/// use redguard::{ManualClock, Redguard};
///
/// let clock = ManualClock::new();
/// let rg = Redguard::memory_builder().clock(clock.clone()).connect().await?;
/// let token = rg.tokens().issue("checkout", Duration::from_secs(60)).await?;
/// clock.advance(Duration::from_secs(61));
/// let expired = rg.tokens().consume("checkout", &token).await;
/// assert!(matches!(expired, Err(redguard::Error::TokenUnknown)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    expiry: BTreeSet<(Duration, String)>,
}

#[derive(Debug)]
struct Entry {
    value: Value,
    expires_at: Duration,
}

#[derive(Debug)]
enum Value {
    Token(TokenState),
}

#[derive(Debug)]
enum TokenState {
    Live { scene: String },
    Used,
}

impl State {
    /// Drops every entry whose time has come.
    fn sweep(&mut self, now: Duration) {
        while let Some((at, _)) = self.expiry.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.expiry.pop_first() {
                self.entries.remove(&key);
            }
        }
    }

    fn get_mut(&mut self, key: &Key) -> Option<&mut Entry> {
        self.entries.get_mut(key.as_str())
    }

    /// Inserts or replaces an entry; a TTL is not optional.
    fn put(&mut self, key: &Key, value: Value, expires_at: Duration) {
        let key = key.as_str().to_owned();
        if let Some(old) = self.entries.get(&key) {
            self.expiry.remove(&(old.expires_at, key.clone()));
        }
        self.expiry.insert((expires_at, key.clone()));
        self.entries.insert(key, Entry { value, expires_at });
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            state: Arc::default(),
            clock: Arc::new(clock),
        }
    }

    /// Locks the state after dropping what has expired; returns the time used.
    fn lock(&self) -> (MutexGuard<'_, State>, Duration) {
        let now = self.clock.now();
        // A panic while holding the lock cannot leave an entry half-written (every mutation is
        // a single map operation), so a poisoned lock is still consistent.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.sweep(now);
        (state, now)
    }

    /// Number of live entries; for tests and diagnostics.
    pub fn len(&self) -> usize {
        self.lock().0.entries.len()
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Memory
    }

    async fn time(&self) -> Result<Duration> {
        Ok(self.clock.now())
    }

    async fn token_issue(&self, key: &Key, scene: &str, ttl: Duration) -> Result<()> {
        let (mut state, now) = self.lock();
        let value = Value::Token(TokenState::Live {
            scene: scene.to_owned(),
        });
        state.put(key, value, now + ttl);
        Ok(())
    }

    async fn token_consume(&self, key: &Key, scene: &str) -> Result<TokenOutcome> {
        let (mut state, _) = self.lock();
        let Some(entry) = state.get_mut(key) else {
            return Ok(TokenOutcome::Unknown);
        };
        let Value::Token(token) = &mut entry.value;
        Ok(match token {
            TokenState::Used => TokenOutcome::AlreadyUsed,
            TokenState::Live { scene: issued } if issued != scene => TokenOutcome::Mismatch,
            TokenState::Live { .. } => {
                *token = TokenState::Used;
                TokenOutcome::Consumed
            }
        })
    }
}
