//! Every store on one virtual clock, for comparing stores with the reference models
//! ([`crate::model`]) exactly.
//!
//! The memory store runs on a [`ManualClock`]. Redis runs the scripts with `redis.call('TIME')`
//! pinned to the same clock (the runtime's `test-util` feature), and with key expiry moved
//! onto it too: Redis expires keys on its real clock, which keeps running while a case runs
//! (ageing keys by each advance, as `PTTL − advance`, would also take off the real time spent
//! between steps, and make an exact comparison at a lease's end flaky). So each script is
//! rewritten before it is sent: a relative expiry (`PEXPIRE key ms`, `SET … PX ms`) becomes
//! the absolute one on the virtual clock (`PEXPIREAT`/`PXAT` now + ms), and `PTTL` is read
//! against it. The virtual clock starts far ahead of the real one ([`EPOCH`]), so Redis
//! itself never expires those keys; the harness does, before each step, deleting every key whose expiry
//! the virtual clock has reached ([`World::advance`]).
//!
//! When a key expires: the memory store and the models drop an entry at its expiry instant.
//! Redis keeps a key through the millisecond of its expiry (it expires once its clock passes
//! it), so a key set for L ms at a whole-ms time t is still there at exactly t + L. The lock,
//! idempotency and token cases run at whole milliseconds and expire keys at the instant
//! ([`Expiry::AtInstant`]), so that this one-millisecond difference, which is Redis's own and
//! not the scripts', does not fail every case that lands on a lease's end. Rate limits run at
//! µs times, where a TTL rounded to ms is right only under Redis's own rule
//! ([`Expiry::AfterMillisecond`]); their state carries absolute times, so expiry only ever
//! drops state that no longer counts — unless a TTL is too short, which is what the rule
//! checks.

/// The runtime's `expiry.lua`: `pexpiretime(key)`, `PEXPIRETIME` on Redis 7.0+ and its
/// equivalent on 6.2.
macro_rules! expiry_prelude {
    () => {
        include_str!("../../runtime/src/store/redis/scripts/expiry.lua")
    };
}

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use redguard::{Redguard, clock::Clock, clock::ManualClock};

use crate::{RedisCluster, RedisServer};

/// Where every virtual clock starts (plus a case's offset): 2100-01-01T00:00:00Z. Far ahead
/// of the real clock, so Redis never expires a key set on the virtual one; fixed, so a case
/// (and the alignment of its rate windows) is the same whenever it runs. Its µs (4.1e15) and
/// fencing tokens stay below 2^53, exact in the scripts' numbers.
pub const EPOCH: Duration = Duration::from_secs(4_102_444_800);

/// Which store a property test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
    Cluster,
}

/// When the harness expires a Redis key (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Once the virtual clock reaches the key's expiry (ms), as the memory store does.
    AtInstant,
    /// Once the virtual clock's ms is past the key's expiry, as Redis does.
    AfterMillisecond,
}

/// The servers of the running test, per thread: proptest runs a test's cases on the thread
/// that started it.
enum Servers {
    Memory,
    Redis(RedisServer),
    Cluster(RedisCluster),
}

thread_local! {
    static SERVERS: RefCell<Option<Servers>> = const { RefCell::new(None) };
}

/// Runs `test` with `backend`'s servers started (a `redis-server`, or a 3-master Cluster);
/// they stop when it returns. Each [`World`] the test makes connects to them.
pub fn with_backend<R>(backend: Backend, test: impl FnOnce() -> R) -> R {
    let servers = match backend {
        Backend::Memory => Servers::Memory,
        Backend::Redis => Servers::Redis(RedisServer::start()),
        Backend::Cluster => Servers::Cluster(RedisCluster::start()),
    };
    SERVERS.with(|s| *s.borrow_mut() = Some(servers));
    // Taken back (and the servers stopped) even when the test panics.
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            SERVERS.with(|s| s.borrow_mut().take());
        }
    }
    let _stop = Stop;
    test()
}

/// A rewrite of a Redis script's source.
pub type Transform = std::sync::Arc<dyn Fn(&str) -> String + Send + Sync>;

/// One test case's store on a fresh virtual clock, with the runtime that drives it.
#[derive(Debug)]
pub struct World {
    pub backend: Backend,
    pub clock: ManualClock,
    pub rg: Redguard,
    pub runtime: tokio::runtime::Runtime,
    /// The masters to sweep (empty on the memory store).
    nodes: Vec<String>,
    expiry: Expiry,
}

impl World {
    /// A fresh store on the current backend (see [`with_backend`]), emptied, with the clock at
    /// [`EPOCH`] + `offset_us`. `transform` rewrites the Redis scripts (a mutation, see
    /// [`crate::mutate`]) before they are moved onto the virtual clock.
    pub fn new(expiry: Expiry, offset_us: u64, transform: Option<Transform>) -> World {
        let clock = ManualClock::starting_at(EPOCH + Duration::from_micros(offset_us));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime");
        let (backend, nodes, builder) = SERVERS.with(|s| {
            let servers = s.borrow();
            match servers.as_ref().expect("run inside vclock::with_backend") {
                Servers::Memory => (Backend::Memory, vec![], Redguard::memory_builder()),
                Servers::Redis(server) => (
                    Backend::Redis,
                    vec![server.url()],
                    Redguard::redis(server.url()),
                ),
                Servers::Cluster(cluster) => (
                    Backend::Cluster,
                    cluster.master_urls(),
                    Redguard::redis_cluster(cluster.urls()),
                ),
            }
        });
        for node in &nodes {
            let mut conn = connection(node);
            // Each case's scripts are new sources (their time is pinned): Redis caches every
            // EVAL'd script until flushed.
            let _: () = redis::cmd("FLUSHALL").query(&mut conn).expect("FLUSHALL");
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut conn)
                .expect("SCRIPT FLUSH");
        }
        let mut builder = builder.clock(clock.clone()).timeout(Duration::from_secs(5));
        if backend != Backend::Memory {
            let at = clock.clone();
            builder = builder.script_transform(move |source| match &transform {
                Some(mutate) => on_virtual_expiry(&mutate(source), &at),
                None => on_virtual_expiry(source, &at),
            });
        }
        let rg = runtime
            .block_on(builder.connect())
            .expect("connect to the store");
        World {
            backend,
            clock,
            rg,
            runtime,
            nodes,
            expiry,
        }
    }

    /// The virtual time, µs since the epoch.
    pub fn now(&self) -> u64 {
        u64::try_from(self.clock.now().as_micros()).expect("µs")
    }

    /// Moves the clock by `us` and expires what that ends.
    pub fn advance(&self, us: u64) {
        self.clock.advance(Duration::from_micros(us));
        self.sweep();
    }

    /// Deletes every Redis key the virtual clock has expired, and checks the rule every key
    /// is written under: it has a TTL, and no longer than the longest any guard setting
    /// allows (a bucket's full burst spans at most 2^50 µs, plus a 30-day block).
    ///
    /// # Panics
    /// On a key without a TTL, or one that outlives every bound.
    pub fn sweep(&self) {
        const LONGEST_MS: i64 = (1 << 50) / 1000 + 30 * 86_400 * 1000;
        let now_ms = i64::try_from(self.now() / 1000).expect("ms");
        for node in &self.nodes {
            let mut conn = connection(node);
            let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
            for key in keys {
                let at: i64 = redis::cmd("EVAL")
                    .arg(concat!(expiry_prelude!(), "return pexpiretime(KEYS[1])"))
                    .arg(1)
                    .arg(&key)
                    .query(&mut conn)
                    .expect("the key's expiry");
                assert!(
                    at != -1,
                    "{key} has no TTL: every key redguard writes must expire"
                );
                assert!(
                    at - now_ms <= LONGEST_MS,
                    "{key} expires in {} ms, beyond every guard's bound",
                    at - now_ms
                );
                let expired = match self.expiry {
                    Expiry::AtInstant => at >= 0 && at <= now_ms,
                    Expiry::AfterMillisecond => at >= 0 && at < now_ms,
                };
                if expired {
                    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).expect("DEL");
                }
            }
        }
    }

    /// For a key written by a plain command (not a script), so on Redis's real clock: checks
    /// its TTL is `ttl` (less the moment since it was set), then moves its expiry onto the
    /// virtual clock, `ttl` from now.
    pub fn pin_expiry(&self, key: &str, ttl: Duration) {
        let Some(node) = self.node_of(key) else {
            return;
        };
        let mut conn = connection(&node);
        let left: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
        let ttl_ms = i64::try_from(ttl.as_millis()).expect("ms");
        assert!(
            (ttl_ms - 1000..=ttl_ms).contains(&left),
            "{key} was written with a TTL of {left} ms, not {ttl_ms}"
        );
        let at = self.now() / 1000 + u64::try_from(ttl_ms).expect("ms");
        let _: () = redis::cmd("PEXPIREAT")
            .arg(key)
            .arg(at)
            .query(&mut conn)
            .expect("PEXPIREAT");
    }

    /// The Redis masters' URLs (none on the memory store).
    pub fn node_urls(&self) -> &[String] {
        &self.nodes
    }

    fn node_of(&self, key: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|node| {
                let exists: i64 = redis::cmd("EXISTS")
                    .arg(key)
                    .query(&mut connection(node))
                    .unwrap_or(0);
                exists == 1
            })
            .cloned()
    }

    /// Runs `future` to completion on this world's runtime, with this world's handle as the
    /// current one.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(self.rg.scope(future))
    }
}

fn connection(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .expect("connect to a test redis-server")
}

/// `source` with its relative expiries on the virtual clock `at` (see the module docs).
///
/// # Panics
/// On an expiry command this does not rewrite, so a new script cannot escape the virtual
/// clock unnoticed.
pub fn on_virtual_expiry(source: &str, at: &ManualClock) -> String {
    for unsupported in [
        "'EXPIRE'",
        "'EX'",
        "'SETEX'",
        "'PSETEX'",
        "'TTL'",
        "'EXPIREAT'",
    ] {
        assert!(
            !source.contains(unsupported),
            "a script uses {unsupported}: teach vclock::on_virtual_expiry to move it onto the virtual clock"
        );
    }
    let now_ms = at.now().as_millis();
    // The runtime's `pexpiretime` (absolute expiries, on every supported server) goes in the
    // header, outside the rewrite, and the script's own copy of it is dropped.
    let mut out = format!(
        "{}local __vms = {now_ms}\n\
         local function __vat(ms) return string.format('%.0f', __vms + tonumber(ms)) end\n\
         local function __pexpire(key, ms) return redis.call('PEXPIREAT', key, __vat(ms)) end\n\
         local function __pttl(key)\n\
           local at = pexpiretime(key)\n\
           if at < 0 then return at end\n\
           return at - __vms\n\
         end\n",
        expiry_prelude!()
    );
    let body = source
        .replacen(expiry_prelude!(), "", 1)
        .replace("redis.call('PEXPIRE', ", "__pexpire(")
        .replace("redis.call('PTTL', ", "__pttl(");
    // `'PX', <ms>)` → `'PXAT', __vat(<ms>))`: the argument runs to the call's closing paren.
    let mut rest = body.as_str();
    while let Some(at) = rest.find("'PX', ") {
        out.push_str(&rest[..at]);
        out.push_str("'PXAT', __vat(");
        rest = &rest[at + "'PX', ".len()..];
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => return true,
                    ')' => depth -= 1,
                    _ => {}
                }
                false
            })
            .map(|(i, _)| i)
            .expect("a 'PX' argument inside a call");
        out.push_str(&rest[..end]);
        out.push(')');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}
