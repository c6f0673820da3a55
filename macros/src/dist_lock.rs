//! `#[dist_lock]`.
//!
//! ```text
//! #[dist_lock(key = "stock:{sku}", wait = "300ms", lease = "30s", scope = "...",
//!             skip_if_held, hold_at_least = "10s", on_lost = "cancel" | "continue",
//!             permits = 3 | read | write | fair)]
//! ```
//!
//! Bounds are checked here so a wrong value fails the build rather than every call; they
//! mirror the runtime's `redguard::lock::{MAX_WAIT, MIN_LEASE, MAX_LEASE, MAX_HOLD_AT_LEAST}`.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Ident, ItemFn, LitStr};

use crate::args::{ArgSpec, Args, Kind, TemplateArg};
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Context, Expansion, Guard, arg};

const MAX_WAIT: Duration = Duration::from_secs(60);
const MIN_LEASE: Duration = Duration::from_secs(1);
const MAX_LEASE: Duration = Duration::from_secs(3600);
const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const MAX_HOLD_AT_LEAST: Duration = Duration::from_secs(24 * 3600);

pub(crate) struct DistLock;

impl Guard for DistLock {
    const NAME: &'static str = "dist_lock";
    const ARGS: &'static [ArgSpec] = &[
        arg("key", Kind::Template),
        arg("wait", Kind::Duration),
        arg("lease", Kind::Duration),
        arg("scope", Kind::Str),
        arg("skip_if_held", Kind::Flag),
        arg("hold_at_least", Kind::Duration),
        arg("on_lost", Kind::Str),
        arg("permits", Kind::Int),
        arg("read", Kind::Flag),
        arg("write", Kind::Flag),
        arg("fair", Kind::Flag),
    ];

    fn check(args: Args, _item: &ItemFn, errors: &mut Errors) -> Option<Box<dyn Expansion>> {
        let wait = args.duration("wait");
        if let Some(wait) = wait
            && wait.value > MAX_WAIT
        {
            // Why: a lock guards a short section; a caller queueing for minutes holds a
            // request (and its resources) hostage. No unbounded wait exists.
            errors.push(
                wait.span,
                "`wait` of `#[dist_lock]` must be at most 60s: waiting is always bounded; \
                 if the section is busy for longer, use `skip_if_held` or retry later",
            );
        }
        let lease = args.duration("lease");
        if let Some(lease) = lease
            && (lease.value < MIN_LEASE || lease.value > MAX_LEASE)
        {
            // Why: renewal every lease/3 needs room for store round trips; a crashed holder
            // blocks the key for a whole lease.
            errors.push(
                lease.span,
                "`lease` of `#[dist_lock]` must be between 1s and 1h: it is how long a crashed \
                 holder blocks the key, and it is renewed every lease/3 while held",
            );
        }
        let hold = args.duration("hold_at_least");
        if let Some(hold) = hold
            && hold.value > MAX_HOLD_AT_LEAST
        {
            errors.push(
                hold.span,
                "`hold_at_least` of `#[dist_lock]` must be at most 24h",
            );
        }
        let skip_if_held = args.flag("skip_if_held");
        if let (Some(_), Some(wait)) = (skip_if_held, wait) {
            // Why: the two contradict; silently ignoring one would surprise.
            errors.push(
                wait.span,
                "`wait` has no effect with `skip_if_held` in `#[dist_lock]`: a held lock \
                 skips the run at once; remove one of them",
            );
        }
        let continue_on_lost = match args.str("on_lost") {
            None => Some(false),
            Some(lit) => match lit.value().as_str() {
                "cancel" => Some(false),
                "continue" => Some(true),
                other => {
                    errors.push(
                        lit.span(),
                        format!(
                            "unknown `on_lost = \"{other}\"` in `#[dist_lock]`; expected \
                             \"cancel\" (stop the body, return LockLost) or \"continue\" \
                             (finish, log and count the loss)"
                        ),
                    );
                    None
                }
            },
        };
        let permits = args.int("permits");
        if let Some(permits) = permits
            && (permits.value == 0 || permits.value > u64::from(u32::MAX))
        {
            errors.push(
                permits.span,
                "`permits` of `#[dist_lock]` must be at least 1 (a semaphore of N holders)",
            );
        }
        if let (Some(_), Some(hold)) = (permits, hold) {
            // Why: a slot is given back by its holder; keeping it after release would
            // silently shrink the semaphore.
            errors.push(
                hold.span,
                "`hold_at_least` applies to exclusive locks, not to a semaphore (`permits`)",
            );
        }
        let (read, write) = (args.flag("read"), args.flag("write"));
        if let (Some(_), Some(write)) = (read, write) {
            errors.push(
                write,
                "`read` and `write` of `#[dist_lock]` exclude each other: a fn takes the \
                 read/write lock in one mode",
            );
        }
        let rw_span = read.or(write);
        if let (Some(rw), Some(_)) = (rw_span, permits) {
            errors.push(
                rw,
                "`#[dist_lock]` is a read/write lock or a semaphore (`permits`), not both",
            );
        }
        if let (Some(_), Some(hold)) = (rw_span, hold) {
            errors.push(
                hold.span,
                "`hold_at_least` applies to exclusive locks, not to a read/write lock",
            );
        }
        let fair = args.flag("fair");
        if let (Some(fair), true) = (fair, rw_span.is_some() || permits.is_some()) {
            errors.push(
                fair,
                "`fair` applies to exclusive locks, not to a read/write lock or a semaphore",
            );
        }
        let key = args.template("key")?;
        Some(Box::new(LockExpansion {
            key: TemplateArg {
                lit: key.lit.clone(),
                segments: key.segments.clone(),
            },
            scope: args.str("scope").cloned(),
            wait: wait.map_or(Duration::ZERO, |w| w.value),
            lease: lease.map_or(DEFAULT_LEASE, |l| l.value),
            skip_if_held: skip_if_held.is_some(),
            hold_at_least: hold.map_or(Duration::ZERO, |h| h.value),
            continue_on_lost: continue_on_lost?,
            permits: permits.map_or(0, |p| u32::try_from(p.value).unwrap_or(u32::MAX)),
            read_write: match (read, write) {
                (Some(_), _) => 1,
                (None, Some(_)) => 2,
                (None, None) => 0,
            },
            fair: fair.is_some(),
        }))
    }
}

struct LockExpansion {
    key: TemplateArg,
    scope: Option<LitStr>,
    wait: Duration,
    lease: Duration,
    skip_if_held: bool,
    hold_at_least: Duration,
    continue_on_lost: bool,
    permits: u32,
    read_write: u8,
    fair: bool,
}

fn duration(d: Duration) -> TokenStream {
    let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_millis(#millis))
}

impl Expansion for LockExpansion {
    /// Input: `key = "stock:{sku}", wait = "300ms"`.
    /// Output: `::redguard::__private::dist_lock_builder(scope, <key>, 300ms, 30s, ..)`, a
    /// `LockBuilder` with the key rendered while the parameters are still borrowable.
    fn prelude(&self, cx: &Context) -> TokenStream {
        let scope = expand::scope(self.scope.as_ref(), cx);
        let key = expand::key(&self.key);
        let wait = duration(self.wait);
        let lease = duration(self.lease);
        let hold = duration(self.hold_at_least);
        let skip = self.skip_if_held;
        let cont = self.continue_on_lost;
        let permits = self.permits;
        let read_write = self.read_write;
        let fair = self.fair;
        quote!(::redguard::__private::dist_lock_builder(
            #scope, #key, #wait, #lease, #skip, #hold, #cont, #permits, #read_write, #fair
        ))
    }

    /// Input: the body future. Output: `::redguard::__private::dist_lock(builder, body)`.
    fn wrap(&self, _cx: &Context, binding: &Ident, inner: TokenStream) -> TokenStream {
        quote!(::redguard::__private::dist_lock(#binding, #inner))
    }
}
