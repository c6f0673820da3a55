//! `redguard`: the operator's command-line tool over [`redguard::admin`].

mod args;
mod human;
mod metrics;

use std::process::ExitCode;

use clap::Parser;
use redguard::admin::{Admin, AdminKey, Quota, QuotaTtl, Resolution, ScanSelect};
use redguard::handle::StoreKind;
use redguard::{Redguard, key::GuardKind, rate::Algorithm, rate::Limit, rate::Rate};
use serde::Serialize;

use crate::args::{Cli, Command, DenyCommand, Guard, QuotaCommand, Target};

/// Any failure: printed as `redguard: <message>`, exit status 1.
type Failure = Box<dyn std::error::Error>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Repairs log at warn: shown on stderr unless RUST_LOG says otherwise.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour(&std::io::stderr()))
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("redguard: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Colour only for a person at a terminal: never in a pipe or a file, nor with `NO_COLOR` set
/// (no-color.org: any non-empty value).
fn colour(stream: &impl std::io::IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn guard_kind(guard: Guard) -> Option<GuardKind> {
    match guard {
        Guard::Idem => Some(GuardKind::Idempotency),
        Guard::Lock => Some(GuardKind::Lock),
        Guard::Rate => Some(GuardKind::RateLimit),
        Guard::Raw => None,
    }
}

fn key(admin: &Admin, guard: GuardKind, target: &Target) -> Result<AdminKey, Failure> {
    let key = if target.raw {
        admin.raw_key(&target.key)?
    } else {
        let scope = target.scope.as_deref().unwrap_or_default();
        admin.key(guard, scope, &target.key)?
    };
    Ok(key)
}

fn print<T: Serialize>(json: bool, value: &T, text: impl FnOnce(&T) -> String) {
    if json {
        // Serializing plain data structures cannot fail.
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    } else {
        print!("{}", text(value));
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let rg = Redguard::from_env().await?;
    if rg.kind() == StoreKind::Memory {
        return Err(
            "no Redis configured: set REDGUARD_REDIS_URL (or REDGUARD_REDIS_CLUSTER_URLS, or \
                    REDGUARD_REDIS_SENTINELS) \
                    to the Redis your services use"
                .into(),
        );
    }
    let admin = Admin::new(rg);
    let json = cli.json;
    match cli.command {
        Command::Inspect(args) => {
            let key = match guard_kind(args.guard) {
                None => admin.raw_key(&args.key)?,
                Some(guard) => {
                    let scope = args
                        .scope
                        .as_deref()
                        .ok_or("--scope is required (the guard's scope; or inspect raw KEY)")?;
                    admin.key(guard, scope, &args.key)?
                }
            };
            let seen = match &args.rate {
                Some(rate) => {
                    let algorithm: Algorithm = args.algorithm.parse()?;
                    let rate: Rate = rate.parse()?;
                    let limit =
                        Limit::new(algorithm, rate, args.burst, args.cost, Default::default())?;
                    admin.inspect_rate(&key, &limit).await?
                }
                None => admin.inspect(&key).await?,
            };
            print(json, &seen, human::inspection);
        }
        Command::Scan(args) => {
            let mut select = match args.guard.and_then(guard_kind) {
                Some(guard) => ScanSelect::guard(guard),
                None => ScanSelect::all(),
            };
            if let Some(scope) = args.scope {
                select = select.scope(scope);
            }
            let report = admin.scan(&select.limit(args.limit)).await?;
            print(json, &report, human::scan);
        }
        Command::Unlock(args) => {
            let key = key(&admin, GuardKind::Lock, &args.target)?;
            let done = admin.unlock(&key, args.owner.as_deref()).await?;
            print(json, &done, human::unlock);
        }
        Command::Forget(target) => {
            let key = key(&admin, GuardKind::Idempotency, &target)?;
            let before = admin.forget(&key).await?;
            let done = human::Forgot {
                key: key.as_str().to_owned(),
                record: before,
            };
            print(json, &done, human::forget);
        }
        Command::Resolve(args) => {
            let key = key(&admin, GuardKind::Idempotency, &args.target)?;
            let resolution = match &args.value {
                Some(value) => Resolution::Succeeded(
                    serde_json::from_str(value)
                        .map_err(|err| format!("--value is not JSON: {err}"))?,
                ),
                None => Resolution::Failed,
            };
            let done = admin.resolve(&key, resolution, args.force).await?;
            print(json, &done, human::resolve);
        }
        Command::Reset(target) => {
            let key = key(&admin, GuardKind::RateLimit, &target)?;
            let deleted = admin.reset(&key).await?;
            let done = human::Repaired {
                key: key.as_str().to_owned(),
                count: deleted,
            };
            print(json, &done, |d| {
                format!("reset {}: {} key(s) deleted\n", d.key, d.count)
            });
        }
        Command::Refund(args) => {
            let key = key(&admin, GuardKind::RateLimit, &args.target)?;
            let back = admin.refund(&key, args.units).await?;
            let done = human::Repaired {
                key: key.as_str().to_owned(),
                count: back,
            };
            print(json, &done, |d| {
                format!("refunded {} unit(s) to {}\n", d.count, d.key)
            });
        }
        Command::Stats(args) => {
            let store = admin.scan(&ScanSelect::all().limit(args.limit)).await?;
            let metrics = match &args.metrics_url {
                Some(url) => Some(metrics::fetch(url).await?),
                None => None,
            };
            let stats = human::Stats { store, metrics };
            print(json, &stats, human::stats);
        }
        Command::Quota(command) => quota(&admin, json, command).await?,
        Command::Usage(args) => {
            // Everything is checked before the store is asked anything.
            let algorithm: Algorithm = args.algorithm.parse()?;
            let rate: Rate = args.rate.parse()?;
            let limit = Limit::new(algorithm, rate, args.burst, args.cost, Default::default())?;
            let usage = admin.usage(&args.scope, &args.key, &limit).await?;
            print(json, &usage, human::usage);
        }
        Command::Deny(command) => deny(&admin, json, command).await?,
        Command::Top(args) => {
            let window = redguard_grammar::duration::parse(&args.window)
                .map_err(|err| format!("--window: {err}"))?;
            let top = admin
                .top(&args.scope, !args.admitted, usize::from(args.n), window)
                .await?;
            print(json, &top, human::top);
        }
    }
    Ok(())
}

async fn quota(admin: &Admin, json: bool, command: QuotaCommand) -> Result<(), Failure> {
    match command {
        QuotaCommand::Set(args) => {
            // Everything is checked before the store is asked anything.
            let quota = Quota::new(args.rate.as_str(), args.burst)?;
            let ttl = match &args.ttl {
                Some(ttl) => QuotaTtl::For(
                    redguard_grammar::duration::parse(ttl)
                        .map_err(|err| format!("--ttl: {err}"))?,
                ),
                None => QuotaTtl::Permanent,
            };
            let set = admin
                .quota_set(&args.target.scope, &args.target.key, &quota, ttl)
                .await?;
            print(json, &set, |q| format!("set {}", human::quota(q)));
        }
        QuotaCommand::Get(target) => {
            let seen = admin.quota_get(&target.scope, &target.key).await?;
            print(json, &seen, |q| match q {
                Some(q) => human::quota(q),
                None => "no override: the limit in the code decides\n".to_owned(),
            });
        }
        QuotaCommand::List(args) => {
            let list = admin.quota_list(&args.scope, args.limit).await?;
            print(json, &list, human::quota_list);
        }
        QuotaCommand::Clear(target) => {
            let cleared = admin.quota_clear(&target.scope, &target.key).await?;
            print(json, &cleared, |c| {
                if *c {
                    "cleared: the limit in the code decides\n".to_owned()
                } else {
                    "no override was set\n".to_owned()
                }
            });
        }
    }
    Ok(())
}

/// How long `deny add` keeps an entry without `--ttl`: an incident's day, not for ever.
const DEFAULT_DENY_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

async fn deny(admin: &Admin, json: bool, command: DenyCommand) -> Result<(), Failure> {
    match command {
        DenyCommand::Add(args) => {
            // Everything is checked before the store is asked anything.
            if args.target.entry == "*" && !args.force {
                return Err(
                    "`*` denies every key of the scope: add --force if that is meant".into(),
                );
            }
            let ttl = match (&args.ttl, args.permanent) {
                (_, true) => QuotaTtl::Permanent,
                (Some(ttl), false) => QuotaTtl::For(
                    redguard_grammar::duration::parse(ttl)
                        .map_err(|err| format!("--ttl: {err}"))?,
                ),
                (None, false) => QuotaTtl::For(DEFAULT_DENY_TTL),
            };
            let added = admin
                .deny_add(
                    &args.target.scope,
                    &args.target.entry,
                    args.reason.as_deref(),
                    ttl,
                )
                .await?;
            print(json, &added, |e| format!("denied {}", human::deny(e)));
        }
        DenyCommand::List(args) => {
            let list = admin.deny_list(&args.scope).await?;
            print(json, &list, |list| {
                if list.is_empty() {
                    "no deny entries\n".to_owned()
                } else {
                    list.iter().map(human::deny).collect()
                }
            });
        }
        DenyCommand::Remove(target) => {
            let removed = admin.deny_remove(&target.scope, &target.entry).await?;
            print(json, &removed, |r| {
                if *r {
                    "removed\n".to_owned()
                } else {
                    "no such entry\n".to_owned()
                }
            });
        }
    }
    Ok(())
}
