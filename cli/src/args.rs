//! The command line, declared with clap's derive.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Inspect, list and repair redguard's state: idempotency records, locks and rate limits.
///
/// Connects like the library (`Redguard::from_env`): REDGUARD_REDIS_CLUSTER_URLS
/// (comma-separated) or REDGUARD_REDIS_URL / REDIS_URL (`redis://user:password@host:port`,
/// `rediss://` for TLS) or REDGUARD_REDIS_SENTINELS (`host:port,...`, with
/// REDGUARD_REDIS_MASTER), REDGUARD_TLS_CA (a PEM file of roots to trust), REDGUARD_PREFIX.
/// Every repair refuses keys outside the prefix and is logged at warn on stderr.
#[derive(Debug, Parser)]
#[command(name = "redguard", version)]
pub(crate) struct Cli {
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Decode what is stored at a key: a record's status, owner and age; a lock's holder,
    /// fence, since when and lease; a rate limit's usage, penalty and (given the limit) the
    /// decision a call would get now.
    Inspect(Inspect),
    /// Count the keys of a guard or scope, with their oldest ages (SCAN, bounded, on every
    /// Cluster master).
    Scan(Scan),
    /// Free a lock by force. The fencing counter is raised, so the old holder's token is
    /// stale: storage that checks tokens refuses its writes.
    Unlock(Unlock),
    /// Delete an idempotency record (e.g. a PROCESSING left by a crash), so a retry runs.
    Forget(Target),
    /// Record a verdict on an idempotency record whose outcome is unknown, after checking
    /// what the execution did: `--succeeded --value <json>` (retries replay the value) or
    /// `--failed` (the next retry runs). A live PROCESSING or a SUCCESS record is refused
    /// unless `--force`. The record keeps its TTL.
    Resolve(Resolve),
    /// Delete a rate limit's state and penalty: the next call starts afresh.
    Reset(Target),
    /// Give units back to a rate limit.
    Refund(Refund),
    /// Per-guard numbers from the store and, with --metrics-url, the service's redguard
    /// metrics.
    Stats(Stats),
    /// Quota overrides: the rate and burst of one rate-limit key, changed at run time and
    /// read by every instance's next call on that key.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// Where one rate-limit key stands: the limit in force and the rule that set it (the
    /// key's override, the longest prefix's, or the limit in the code given with --rate),
    /// used, remaining and reset of the next call (peeked: nothing charged).
    Usage(UsageArgs),
    /// Deny lists: rate-limit keys, key prefixes or IP networks of a scope whose calls are
    /// refused outright (HTTP 403), read by every instance's next call.
    #[command(subcommand)]
    Deny(DenyCommand),
    /// The keys of a scope's rate limits refused (or, with --admitted, admitted) most over
    /// the last minutes, across every instance: who is being limited.
    Top(TopArgs),
}

/// `redguard top SCOPE [--admitted] [-n N] [--window D]`.
#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    /// The limits' scope: the fn's path or its `scope = ".."`.
    pub(crate) scope: String,
    /// The keys admitted most, instead of those refused most.
    #[arg(long)]
    pub(crate) admitted: bool,
    /// How many keys (1 to 256).
    #[arg(short, long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) n: u16,
    /// How far back (`5m`; whole minutes, the current one included; at most 15m).
    #[arg(long, default_value = "5m")]
    pub(crate) window: String,
}

/// `redguard usage SCOPE KEY --rate R`.
#[derive(Debug, Args)]
pub(crate) struct UsageArgs {
    /// The limit's scope: the fn's path or its `scope = ".."`.
    pub(crate) scope: String,
    /// The rendered key template (`tenant:acme`).
    pub(crate) key: String,
    /// The limit in the code, or the tenant's plan (`100/min`): an override replaces it.
    #[arg(long)]
    pub(crate) rate: String,
    /// The code's burst (bucket algorithms).
    #[arg(long)]
    pub(crate) burst: Option<u64>,
    /// The code's algorithm.
    #[arg(long, default_value = "gcra")]
    pub(crate) algorithm: String,
    /// The cost of one call.
    #[arg(long, default_value_t = 1)]
    pub(crate) cost: u64,
}

/// `redguard deny ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DenyCommand {
    /// Deny a key (`tenant:acme`), a key prefix (`tenant:*`) or, for IP keys, a network
    /// (`10.0.0.0/8`, `2001:db8::/32`) in the rate limits of SCOPE: `deny add SCOPE ENTRY
    /// [--ttl 24h | --permanent] [--reason TEXT]`. Without --ttl the entry lasts 24h. `*`
    /// alone (every key of the scope) needs --force. Refused (nothing written) for an entry
    /// the guards would not render, a reason or TTL out of bounds, a full list, a scope with
    /// no rate limit in the store, or a prefix or network on a Redis Cluster.
    Add(DenyAdd),
    /// List the live entries of a scope.
    List(DenyScope),
    /// Remove an entry, as added or as listed.
    Remove(DenyEntryArg),
}

#[derive(Debug, Args)]
pub(crate) struct DenyEntryArg {
    /// The limits' scope: the fn's path or its `scope = ".."`.
    pub(crate) scope: String,
    /// A rendered key, a prefix ending in `*`, or a CIDR.
    pub(crate) entry: String,
}

#[derive(Debug, Args)]
pub(crate) struct DenyAdd {
    #[command(flatten)]
    pub(crate) target: DenyEntryArg,
    /// How long the entry lasts (`24h`, `30d`; 1s to 365d). Default 24h.
    #[arg(long, conflicts_with = "permanent")]
    pub(crate) ttl: Option<String>,
    /// Keep the entry until removed (an exact key's: 365 days, the longest TTL).
    #[arg(long)]
    pub(crate) permanent: bool,
    /// Why (shown by `deny list` and in the services' logs, never to the client).
    #[arg(long)]
    pub(crate) reason: Option<String>,
    /// Allow `*` alone: deny every key of the scope.
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DenyScope {
    /// The limits' scope.
    pub(crate) scope: String,
}

/// `redguard quota ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum QuotaCommand {
    /// Set the override of one key, or of a key prefix (`tenant:*`): `quota set SCOPE KEY
    /// --rate 100/s [--burst 200] (--ttl 30d | --permanent)`. An exact key's override wins
    /// over the longest prefix's, which wins over the code. Refused (nothing written) for a
    /// rate, burst or TTL out of bounds, a key the guards would not render, a scope with no
    /// rate limit in the store, or a prefix on a Redis Cluster.
    Set(QuotaSet),
    /// Show the override of one key.
    Get(QuotaTarget),
    /// List the overrides of a scope (SCAN, bounded).
    List(QuotaScope),
    /// Remove the override of one key: the limit in the code decides again.
    Clear(QuotaTarget),
}

/// A rate limit's key: its scope and rendered template.
#[derive(Debug, Args)]
pub(crate) struct QuotaTarget {
    /// The limit's scope: the fn's path or its `scope = ".."`.
    pub(crate) scope: String,
    /// The rendered key template (`tenant:acme`), or a prefix of it ending in `*`
    /// (`tenant:*`; `*`: the whole scope).
    pub(crate) key: String,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("lifetime").required(true).args(["ttl", "permanent"])))]
pub(crate) struct QuotaSet {
    #[command(flatten)]
    pub(crate) target: QuotaTarget,
    /// The rate (`100/s`, `5000/h`), as the attributes take it.
    #[arg(long)]
    pub(crate) rate: String,
    /// The burst (default: the rate's count); a window algorithm admits the rate's count.
    #[arg(long)]
    pub(crate) burst: Option<u64>,
    /// How long the override lasts (`30d`, `12h`; 1s to 365d).
    #[arg(long)]
    pub(crate) ttl: Option<String>,
    /// Keep the override until cleared.
    #[arg(long)]
    pub(crate) permanent: bool,
}

#[derive(Debug, Args)]
pub(crate) struct QuotaScope {
    /// The limits' scope.
    pub(crate) scope: String,
    /// Look at no more than this many keys of the scope.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one())]
    pub(crate) limit: usize,
}

/// Which guard's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Guard {
    /// `#[idempotent]` records.
    Idem,
    /// `#[dist_lock]` and `redguard::lock` locks, of every kind.
    Lock,
    /// `#[rate_limit]` and `redguard::limiter` state.
    Rate,
    /// A full key as stored in Redis (any of the above).
    Raw,
}

/// A key: the guard's scope and rendered template, or (`--raw`) the full key.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The guard's scope: the fn's path (`shop::orders::reserve_stock`) or its `scope = ".."`.
    #[arg(long, short, required_unless_present = "raw")]
    pub(crate) scope: Option<String>,
    /// The rendered key template (`stock:SK-1`), or with --raw the full key as stored.
    pub(crate) key: String,
    /// KEY is a full key as stored (`redguard:lock:{..}`).
    #[arg(long)]
    pub(crate) raw: bool,
}

#[derive(Debug, Args)]
pub(crate) struct Inspect {
    /// The guard whose key this is (`raw`: KEY is a full key as stored).
    #[arg(value_enum)]
    pub(crate) guard: Guard,
    /// The rendered key template (`stock:SK-1`), or the full key for `raw`.
    pub(crate) key: String,
    /// The guard's scope (not for `raw`).
    #[arg(long, short)]
    pub(crate) scope: Option<String>,
    /// A rate limit's rate (`5/s`, `100/min`): also show the decision a call would get now.
    #[arg(long)]
    pub(crate) rate: Option<String>,
    /// With --rate: the burst (bucket algorithms).
    #[arg(long, requires = "rate")]
    pub(crate) burst: Option<u64>,
    /// With --rate: the algorithm (default gcra).
    #[arg(long, requires = "rate", default_value = "gcra")]
    pub(crate) algorithm: String,
    /// With --rate: the cost of the call.
    #[arg(long, requires = "rate", default_value_t = 1)]
    pub(crate) cost: u64,
}

#[derive(Debug, Args)]
pub(crate) struct Scan {
    /// Only this guard's keys.
    #[arg(value_enum)]
    pub(crate) guard: Option<Guard>,
    /// Only this scope's keys (with a guard).
    #[arg(long, short, requires = "guard")]
    pub(crate) scope: Option<String>,
    /// Look at no more than this many keys.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one())]
    pub(crate) limit: usize,
}

#[derive(Debug, Args)]
pub(crate) struct Unlock {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Only this holder (a semaphore's or read lock's holder, or the lock if it holds it).
    #[arg(long)]
    pub(crate) owner: Option<String>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["succeeded", "failed"])))]
pub(crate) struct Resolve {
    #[command(flatten)]
    pub(crate) target: Target,
    /// The execution's effects happened: record SUCCESS with --value.
    #[arg(long, requires = "value")]
    pub(crate) succeeded: bool,
    /// The result retries get: the JSON the guarded fn's `Ok` value serializes to.
    #[arg(long, requires = "succeeded")]
    pub(crate) value: Option<String>,
    /// They did not happen (or were undone): record FAIL, so the next retry runs the body.
    #[arg(long)]
    pub(crate) failed: bool,
    /// Also overwrite a PROCESSING record (an execution may still be running) or a SUCCESS one.
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Debug, Args)]
pub(crate) struct Refund {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Units to give back: 1 to the largest count a rate may have.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=redguard_grammar::rate::MAX_RATE_COUNT))]
    pub(crate) units: u64,
}

#[derive(Debug, Args)]
pub(crate) struct Stats {
    /// The service's Prometheus endpoint (`http://host:port/metrics`).
    #[arg(long)]
    pub(crate) metrics_url: Option<String>,
    /// Look at no more than this many keys.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one())]
    pub(crate) limit: usize,
}

/// A count of keys: looking at none would answer "nothing here" without looking.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}
