//! Lock operations on Redis, and the pub/sub subscription that wakes waiters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt as _;
use redis::ServerErrorKind;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::RedisStore;
use super::lua::{Lua, lua};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::store::lock::{FAIR_REGISTRATION, FENCE_TTL, WRITER_INTENT, Waiters, rw_readers};
use crate::store::{Acquire, LockAcquire, LockOps, LockRelease, LockWatch, Release};

lua!(ACQUIRE = "lock_acquire.lua" after "fence.lua");
lua!(RENEW = "lock_renew.lua");
lua!(RELEASE = "lock_release.lua");
lua!(SEM_ACQUIRE = "sem_acquire.lua" after "fence.lua");
lua!(SEM_RENEW = "sem_renew.lua");
lua!(RW_ACQUIRE = "rw_acquire.lua" after "fence.lua");
lua!(RW_RELEASE_READ = "rw_release_read.lua");
lua!(FAIR_ACQUIRE = "fair_acquire.lua" after "fence.lua");
lua!(FAIR_RELEASE = "fair_release.lua" after "fence.lua");
lua!(SEM_RELEASE = "sem_release.lua");

/// The pattern that covers the release channels of every lock under `prefix`: the release
/// scripts publish on the lock key's own name, `<prefix>:lock:{<scope>:<body>}` (semaphores
/// and the other kinds add a suffix). It is `<prefix>:*` exactly, because Redis's ACL matches
/// a `PSUBSCRIBE` pattern literally against the user's channel grants: `&redguard:*` allows
/// this pattern and no other (a prefix holds no glob characters). Other messages under the
/// prefix wake nobody.
fn release_pattern(prefix: &str) -> String {
    format!("{prefix}:*")
}

/// The suffix of a lock's fencing counter (see [`Key::companion`]).
const FENCE: &str = "fence";

/// `key.companion(suffix)` written straight into a command: the acquisition, the hot path,
/// then renders no key of its own.
struct Companion<'a>(&'a Key, &'static str);

impl redis::ToRedisArgs for Companion<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's own buffer: they cannot fail.
        let _ = arg.write_all(self.0.as_str().as_bytes());
        let _ = arg.write_all(b":");
        let _ = arg.write_all(self.1.as_bytes());
    }
}

/// The payload an operator's reset of a rate limit publishes on the limit's key.
pub(super) const RESET: &[u8] = b"reset";

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![
        &ACQUIRE,
        &RENEW,
        &RELEASE,
        &SEM_ACQUIRE,
        &SEM_RENEW,
        &SEM_RELEASE,
        &RW_ACQUIRE,
        &RW_RELEASE_READ,
        &FAIR_ACQUIRE,
        &FAIR_RELEASE,
    ]
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The TTL (ms) of a fencing counter: it must outlive the lock it fences.
fn fence_ttl(lease: Duration) -> u64 {
    millis(FENCE_TTL.max(lease))
}

#[async_trait]
impl LockOps for RedisStore {
    async fn lock_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        let Acquire {
            key,
            owner,
            lease,
            level,
            waiting,
            replicas,
        } = acquire;
        let mut cmd = super::evalsha(&ACQUIRE, 2, 5);
        cmd.arg(key.as_str())
            .arg(Companion(key, FENCE))
            .arg(owner)
            .arg(millis(lease))
            .arg(level)
            .arg(fence_ttl(lease))
            .arg(if waiting { "1" } else { "0" });
        let reply: (i64, i64, i64) = self
            .run_confirmed("lock_acquire", &ACQUIRE, cmd, Some(key), replicas, acquired)
            .await?;
        match reply {
            (3, _, _) => Err(Error::Corrupt {
                key: key.to_string(),
                detail: "not a lock hash with an owner and numeric depth and fence".to_owned(),
            }),
            // PTTL is -1 when someone wrote the key without a TTL: not ours to fix, reported.
            _ => acquire_reply(key, "lock_acquire", reply),
        }
    }

    async fn lock_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool> {
        let renewed: i64 = self
            .eval("lock_renew", &RENEW, &[key], &[&owner, &millis(lease)])
            .await?;
        Ok(renewed == 1)
    }

    async fn lock_release(&self, release: Release<'_>) -> Result<LockRelease> {
        let Release {
            key,
            owner,
            level,
            keep,
        } = release;
        let keep = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        let code: i64 = self
            .eval("lock_release", &RELEASE, &[key], &[&owner, &level, &keep])
            .await?;
        release_reply(key, "lock_release", code)
    }

    async fn semaphore_acquire(&self, acquire: Acquire<'_>, permits: u32) -> Result<LockAcquire> {
        let Acquire {
            key, owner, lease, ..
        } = acquire;
        let fence_key = key.companion("fence");
        let fence_ttl = fence_ttl(lease);
        let reply: (i64, i64, i64) = self
            .eval_confirmed(
                "semaphore_acquire",
                &SEM_ACQUIRE,
                &[key, &fence_key],
                &[&owner, &permits, &millis(lease), &fence_ttl],
                acquire.replicas,
                acquired,
            )
            .await?;
        acquire_reply(key, "semaphore_acquire", reply)
    }

    async fn semaphore_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool> {
        let renewed: i64 = self
            .eval(
                "semaphore_renew",
                &SEM_RENEW,
                &[key],
                &[&owner, &millis(lease)],
            )
            .await?;
        Ok(renewed == 1)
    }

    async fn semaphore_release(&self, key: &Key, owner: &str) -> Result<LockRelease> {
        let released: i64 = self
            .eval("semaphore_release", &SEM_RELEASE, &[key], &[&owner])
            .await?;
        Ok(if released == 1 {
            LockRelease::Released
        } else {
            LockRelease::NotOwner
        })
    }

    async fn rw_acquire(&self, acquire: Acquire<'_>, write: bool) -> Result<LockAcquire> {
        let Acquire {
            key,
            owner,
            lease,
            waiting: announce,
            ..
        } = acquire;
        let readers = rw_readers(key);
        let intent = key.companion("intent");
        let fence_key = key.companion("fence");
        let mode = match (write, announce) {
            (true, true) => "W",
            (true, false) => "w",
            (false, _) => "r",
        };
        let reply: (i64, i64, i64) = self
            .eval_confirmed(
                "rw_acquire",
                &RW_ACQUIRE,
                &[key, &readers, &intent, &fence_key],
                &[
                    &owner,
                    &mode,
                    &millis(lease),
                    &fence_ttl(lease),
                    &millis(WRITER_INTENT),
                ],
                acquire.replicas,
                acquired,
            )
            .await?;
        acquire_reply(key, "rw_acquire", reply)
    }

    async fn rw_release_read(&self, key: &Key, owner: &str) -> Result<LockRelease> {
        let readers = rw_readers(key);
        let released: i64 = self
            .eval(
                "rw_release_read",
                &RW_RELEASE_READ,
                &[key, &readers],
                &[&owner],
            )
            .await?;
        Ok(if released == 1 {
            LockRelease::Released
        } else {
            LockRelease::NotOwner
        })
    }

    async fn fair_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        let Acquire {
            key,
            owner,
            lease,
            level,
            waiting: join,
            ..
        } = acquire;
        let [queue, registered, fence] = fair_keys(key);
        let reply: (i64, i64, i64) = self
            .eval_confirmed(
                "fair_acquire",
                &FAIR_ACQUIRE,
                &[key, &queue, &registered, &fence],
                &[
                    &owner,
                    &millis(lease),
                    &level,
                    &fence_ttl(lease),
                    &millis(FAIR_REGISTRATION),
                    &if join { "1" } else { "0" },
                ],
                acquire.replicas,
                acquired,
            )
            .await?;
        acquire_reply(key, "fair_acquire", reply)
    }

    async fn fair_release(&self, release: Release<'_>) -> Result<LockRelease> {
        let Release {
            key,
            owner,
            level,
            keep,
        } = release;
        let code = self.fair_script(key, owner, level, keep, false).await?;
        release_reply(key, "fair_release", code)
    }

    async fn fair_leave(&self, key: &Key, owner: &str) -> Result<()> {
        self.fair_script(key, owner, 1, Duration::ZERO, true)
            .await?;
        Ok(())
    }

    async fn lock_watch(&self, key: &Key) -> LockWatch {
        self.bus.watch(key, None, self.timeout()).await
    }

    async fn fair_watch(&self, key: &Key, owner: &str) -> LockWatch {
        self.bus.watch(key, Some(owner), self.timeout()).await
    }
}

impl RedisStore {
    /// Runs the fair lock's release script: leaving `level` of the lock, or (`leaving`) a
    /// waiter's place in the queue.
    async fn fair_script(
        &self,
        key: &Key,
        owner: &str,
        level: u32,
        keep: Duration,
        leaving: bool,
    ) -> Result<i64> {
        let [queue, registered, fence] = fair_keys(key);
        let keep = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        let leaving = if leaving { "1" } else { "0" };
        self.eval(
            "fair_release",
            &FAIR_RELEASE,
            &[key, &queue, &registered, &fence],
            &[
                &owner,
                &level,
                &keep,
                &leaving,
                &fence_ttl(Duration::ZERO),
                &millis(FAIR_REGISTRATION),
            ],
        )
        .await
    }
}

/// Decodes the `-1 | 0 | depth` reply of the release scripts.
fn release_reply(key: &Key, op: &str, code: i64) -> Result<LockRelease> {
    match code {
        -1 => Ok(LockRelease::NotOwner),
        0 => Ok(LockRelease::Released),
        depth => Ok(LockRelease::Nested {
            depth: u32::try_from(depth).map_err(|_| Error::Corrupt {
                key: key.to_string(),
                detail: format!("{op} returned {depth}"),
            })?,
        }),
    }
}

/// The queue, registrations and fencing counter of the fair lock at `key`.
fn fair_keys(key: &Key) -> [Key; 3] {
    [
        key.companion("queue"),
        key.companion("registered"),
        key.companion("fence"),
    ]
}

/// Decodes the `{code, fence or wait, depth}` reply of the acquire scripts.
/// The reply of an acquire script that took the lock (or a nested level): the write a
/// [`Replicas`](crate::store::Replicas) confirmation is about.
fn acquired(reply: &(i64, i64, i64)) -> bool {
    reply.0 == 1
}

fn acquire_reply(key: &Key, op: &str, reply: (i64, i64, i64)) -> Result<LockAcquire> {
    let corrupt = || Error::Corrupt {
        key: key.to_string(),
        detail: format!("{op} returned {reply:?}"),
    };
    match reply {
        (1, fence, depth) => Ok(LockAcquire::Acquired {
            fence: u64::try_from(fence).map_err(|_| corrupt())?,
            depth: u32::try_from(depth).map_err(|_| corrupt())?,
        }),
        (0, wait, _) if wait >= 0 => Ok(LockAcquire::Held {
            ttl: Duration::from_millis(wait.unsigned_abs()),
        }),
        (2, _, _) => Ok(LockAcquire::Lost),
        (4, _, _) => Err(Error::Corrupt {
            key: key.companion("fence").to_string(),
            detail: "the fencing counter is not a non-negative integer below 2^53".to_owned(),
        }),
        _ => Err(corrupt()),
    }
}

/// Where the release subscription connects: one node, or (Sentinel) whichever node is the
/// master now, moving with it.
#[derive(Clone)]
pub(crate) enum BusSource {
    Fixed(Box<redis::Client>),
    #[cfg(feature = "sentinel")]
    Sentinel(super::sentinel::SentinelConn),
}

impl BusSource {
    /// The client to subscribe with now, and a token [`moved`](BusSource::moved) compares.
    fn client(&self) -> Option<(redis::Client, u64)> {
        match self {
            BusSource::Fixed(client) => Some((redis::Client::clone(client), 0)),
            #[cfg(feature = "sentinel")]
            BusSource::Sentinel(conn) => {
                let generation = conn.generation();
                conn.master_client().map(|client| (client, generation))
            }
        }
    }

    /// Resolves when the node subscribed to at `generation` is no longer the one to use:
    /// releases are published on the master, so the subscription must follow it.
    #[cfg_attr(not(feature = "sentinel"), allow(unused_variables))]
    async fn moved(&self, generation: u64) {
        match self {
            BusSource::Fixed(_) => std::future::pending().await,
            #[cfg(feature = "sentinel")]
            BusSource::Sentinel(conn) => conn.moved_from(generation).await,
        }
    }
}

/// The pub/sub side of a [`RedisStore`]: one dedicated connection, opened on the first wait
/// (or the first rate rejection the local tier keeps), pattern-subscribed to every lock's
/// release channel and fanning messages out to local waiters; an operator's `reset` of a
/// rate limit (payload `reset` on the limit's key) is noted for the local tier. It
/// reconnects by itself; while it is down, waiters poll.
pub(crate) struct ReleaseBus {
    source: BusSource,
    pattern: String,
    waiters: Arc<Waiters>,
    resets: Arc<Resets>,
    subscribed: watch::Sender<bool>,
    /// The last attempt to subscribe failed, or the subscription was lost, and it is not back
    /// yet: Redis is unreachable or restarting.
    down: Arc<AtomicBool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for ReleaseBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseBus")
            .field("subscribed", &*self.subscribed.borrow())
            .finish_non_exhaustive()
    }
}

impl ReleaseBus {
    pub(crate) fn new(source: BusSource, prefix: &str) -> Self {
        ReleaseBus {
            source,
            pattern: release_pattern(prefix),
            waiters: Arc::default(),
            resets: Arc::default(),
            subscribed: watch::channel(false).0,
            down: Arc::default(),
            task: Mutex::new(None),
        }
    }

    /// Subscribes a waiter to `key` (to `owner`'s turns at a fair lock), starting the
    /// connection if needed and waiting up to `timeout` for the subscription to be in place
    /// (after that the watch polls).
    pub(super) async fn watch(
        &self,
        key: &Key,
        owner: Option<&str>,
        timeout: Duration,
    ) -> LockWatch {
        let watch = |live| match owner {
            Some(owner) => self.waiters.watch_handed(key.as_str(), owner, live),
            None => self.waiters.watch(key.as_str(), live),
        };
        if self.down.load(Ordering::SeqCst) {
            // Waiting for a subscription that just failed would add a whole timeout to every
            // acquisition while Redis is away: poll at once; releases are delivered again as
            // soon as the subscription is back.
            self.ensure_running();
            return watch(false);
        }
        // Registered first: a release delivered while we wait for the subscription counts.
        let mut ready = self.subscribed.subscribe();
        let watch = watch(true);
        self.ensure_running();
        let live = tokio::time::timeout(timeout, ready.wait_for(|subscribed| *subscribed))
            .await
            .is_ok_and(|subscribed| subscribed.is_ok());
        if live { watch } else { LockWatch::polling() }
    }

    /// Starts the subscription if it is not running, for [`reset_after`](Self::reset_after).
    pub(crate) fn listen(&self) {
        self.ensure_running();
    }

    /// Whether a reset of `key` was announced after `since`.
    pub(crate) fn reset_after(&self, key: &Key, since: Instant) -> bool {
        self.resets.after(key.as_str(), since)
    }

    fn ensure_running(&self) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        // Outside a Tokio runtime there is nothing to drive the connection: waiters poll.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let bus = Bus {
            source: self.source.clone(),
            pattern: self.pattern.clone(),
            waiters: Arc::clone(&self.waiters),
            resets: Arc::clone(&self.resets),
            subscribed: self.subscribed.clone(),
            down: Arc::clone(&self.down),
        };
        *task = Some(runtime.spawn(bus.run()));
    }
}

impl Drop for ReleaseBus {
    fn drop(&mut self) {
        let task = self.task.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = task.take() {
            task.abort();
        }
    }
}

/// Rate-limit keys whose reset was announced, and when it arrived. Only the last
/// [`RESET_MEMORY`] matter: the local tier asks the store again after that anyway.
#[derive(Default)]
struct Resets {
    seen: Mutex<HashMap<String, Instant>>,
}

/// How long an announced reset is kept: longer than the local tier repeats a refusal
/// without asking the store (`rate::local::RECHECK_AFTER`).
const RESET_MEMORY: Duration = Duration::from_secs(5);

impl Resets {
    fn note(&self, key: &str) {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|_, at| now.duration_since(*at) < RESET_MEMORY);
        seen.insert(key.to_owned(), now);
    }

    fn after(&self, key: &str, since: Instant) -> bool {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(key).is_some_and(|at| *at > since)
    }
}

/// What the subscription task owns.
struct Bus {
    source: BusSource,
    pattern: String,
    waiters: Arc<Waiters>,
    resets: Arc<Resets>,
    subscribed: watch::Sender<bool>,
    down: Arc<AtomicBool>,
}

impl Bus {
    /// Keeps the subscription up: connect, subscribe, deliver; on any failure mark it down,
    /// wake every waiter (a release may have been missed) and retry with a capped backoff.
    async fn run(self) {
        let mut backoff = Duration::from_millis(50);
        let mut refused = false;
        loop {
            let Some((client, generation)) = self.source.client() else {
                // No master known (Sentinel, mid-failover): like a failed attempt.
                self.down.store(true, Ordering::SeqCst);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            };
            let connected = tokio::time::timeout(Duration::from_secs(3), async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.psubscribe(&self.pattern).await?;
                Ok::<_, redis::RedisError>(pubsub)
            })
            .await;
            match connected {
                Ok(Ok(pubsub)) => {
                    backoff = Duration::from_millis(50);
                    refused = false;
                    self.down.store(false, Ordering::SeqCst);
                    self.subscribed.send_replace(true);
                    tracing::debug!(pattern = %self.pattern, "lock release subscription up");
                    tokio::select! {
                        () = self.deliver(pubsub) => {}
                        () = self.source.moved(generation) => {}
                    }
                    self.subscribed.send_replace(false);
                    self.down.store(true, Ordering::SeqCst);
                    self.waiters.notify_all();
                    tracing::warn!("lock release subscription lost; waiters poll until it is back");
                }
                // Refused by an ACL, or disabled (a managed service's `rename-command
                // PSUBSCRIBE ""` answers `unknown command`).
                Ok(Err(err))
                    if err.kind() == redis::ErrorKind::Server(ServerErrorKind::NoPerm)
                        || err
                            .detail()
                            .is_some_and(|detail| detail.starts_with("unknown command")) =>
                {
                    self.down.store(true, Ordering::SeqCst);
                    metrics::counter!("redguard_lock_subscription_refused_total").increment(1);
                    // Once per refusal streak: the ACL will not change by itself every 500 ms.
                    if !refused {
                        refused = true;
                        tracing::warn!(
                            pattern = %self.pattern,
                            error = %err,
                            "the server refuses lock release notifications to this user; \
                             waiters poll instead (grant the channels with `&<prefix>:*`, or \
                             enable PSUBSCRIBE)"
                        );
                    }
                }
                Ok(Err(err)) => {
                    self.down.store(true, Ordering::SeqCst);
                    tracing::debug!(error = %err, "lock release subscription failed");
                }
                Err(_) => {
                    self.down.store(true, Ordering::SeqCst);
                    tracing::debug!("lock release subscription timed out");
                }
            }
            tokio::time::sleep(backoff).await;
            // Capped low: after Redis comes back, waiters poll until the subscription is up.
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Fans messages out until the connection ends.
    async fn deliver(&self, pubsub: redis::aio::PubSub) {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            // '1' is news for every waiter; a fair lock's hand-off names the new holder and
            // its fencing token, and is news for it alone.
            let channel = message.get_channel_name();
            let payload = message.get_payload_bytes();
            if payload == RESET {
                self.resets.note(channel);
                continue;
            }
            let handed = std::str::from_utf8(payload)
                .ok()
                .and_then(|text| text.split_once(' '))
                .and_then(|(owner, fence)| Some((owner, fence.parse().ok()?)));
            match handed {
                Some((owner, fence)) => self.waiters.hand_over(channel, owner, fence),
                None => self.waiters.notify(channel),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fencing counter the acquisition names is the one every other script names.
    #[test]
    fn companion_arg_is_the_companion_key() {
        let key = Key::stored("redguard:lock:{scope:order=7}");
        let mut written = redis::cmd("EVALSHA");
        written.arg(Companion(&key, FENCE)).arg("next");
        let mut rendered = redis::cmd("EVALSHA");
        rendered.arg(key.companion(FENCE).as_str()).arg("next");
        assert_eq!(written.get_packed_command(), rendered.get_packed_command());
    }
}
