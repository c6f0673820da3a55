//! `#[dist_lock]`.
//!
//! ```text
//! #[dist_lock(key = "stock:{sku}", wait = "300ms", lease = "30s", scope = "...",
//!             skip_if_held, hold_at_least = "10s", on_lost = "cancel" | "continue",
//!             permits = 3 | read | write | fair, replicas = 1, replicas_timeout = "50ms")]
//! ```
//!
//! Bounds are checked here, by the runtime's own checks (`redguard_grammar::lock`), so a wrong
//! value fails the build rather than every call.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Ident, LitStr};

use redguard_grammar::lock as grammar;

use crate::args::{Spanned, TemplateArg, arguments};
use crate::check;
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Built, Context, Expansion, Guard};

pub(crate) struct DistLock;

arguments! {
    /// `#[dist_lock(key = "..", wait = "..", lease = "..", scope = "..", skip_if_held,
    /// hold_at_least = "..", on_lost = "..", permits = n | read | write | fair, replicas = n,
    /// replicas_timeout = "..")]`
    LockArgs for "dist_lock" {
        key: Template,
        wait: Duration,
        lease: Duration,
        scope: Str,
        skip_if_held: Flag,
        hold_at_least: Duration,
        on_lost: Str,
        permits: Int,
        read: Flag,
        write: Flag,
        fair: Flag,
        replicas: Int,
        replicas_timeout: Duration,
    }
}

/// Checks a duration argument with the runtime's own check.
fn checked<'a>(
    name: &str,
    value: &'a Option<Spanned<Duration>>,
    check: fn(Duration) -> Result<(), String>,
    errors: &mut Errors,
) -> Option<&'a Spanned<Duration>> {
    let value = value.as_ref()?;
    if let Err(why) = check(value.value) {
        errors.push(
            value.span,
            format!("invalid `{name}` of `#[dist_lock]`: {why}"),
        );
    }
    Some(value)
}

impl Guard for DistLock {
    type Args = LockArgs;

    fn check(args: LockArgs, errors: &mut Errors) -> Option<Built> {
        // Why each bound exists is in the runtime's message: a lock guards a short section
        // (no unbounded wait), renewal needs room within the lease, and a crashed holder
        // blocks the key for a whole lease.
        let wait = checked("wait", &args.wait, grammar::wait, errors);
        let lease = checked("lease", &args.lease, grammar::lease, errors);
        let hold = checked(
            "hold_at_least",
            &args.hold_at_least,
            grammar::hold_at_least,
            errors,
        );
        let skip_if_held = args.skip_if_held;
        if let (Some(_), Some(wait)) = (skip_if_held, wait) {
            // Why: the two contradict; silently ignoring one would surprise.
            errors.push(
                wait.span,
                "`wait` has no effect with `skip_if_held` in `#[dist_lock]`: a held lock \
                 skips the run at once; remove one of them",
            );
        }
        let continue_on_lost = match &args.on_lost {
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
        let permits = args.permits.as_ref();
        if let Some(permits) = permits
            && let Err(why) = grammar::permits(permits.value)
        {
            errors.push(
                permits.span,
                format!("invalid `permits` of `#[dist_lock]`: {why}"),
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
        let (read, write) = (args.read, args.write);
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
        let fair = args.fair;
        if let (Some(fair), true) = (fair, rw_span.is_some() || permits.is_some()) {
            errors.push(
                fair,
                "`fair` applies to exclusive locks, not to a read/write lock or a semaphore",
            );
        }
        let replicas = check::replicas(
            "dist_lock",
            args.replicas.as_ref(),
            args.replicas_timeout.as_ref(),
            errors,
        );
        let key = args.key.clone()?;
        let kind = match (permits, read, write, fair) {
            (Some(permits), ..) => Some(LockKind::Semaphore(
                u32::try_from(permits.value).unwrap_or(u32::MAX),
            )),
            (None, Some(_), ..) => Some(LockKind::Read),
            (None, None, Some(_), _) => Some(LockKind::Write),
            (None, None, None, Some(_)) => Some(LockKind::Fair),
            (None, None, None, None) => None,
        };
        Some(Built::Wrapper(Box::new(LockExpansion {
            key,
            scope: args.scope.clone(),
            kind,
            wait: wait.map(|w| w.value),
            lease: lease.map(|l| l.value),
            skip_if_held: skip_if_held.is_some(),
            hold_at_least: hold.map(|h| h.value),
            continue_on_lost: continue_on_lost?,
            replicas,
        })))
    }
}

/// The kind of lock, when not the default exclusive one.
enum LockKind {
    Semaphore(u32),
    Read,
    Write,
    Fair,
}

struct LockExpansion {
    key: TemplateArg,
    scope: Option<LitStr>,
    kind: Option<LockKind>,
    wait: Option<Duration>,
    lease: Option<Duration>,
    skip_if_held: bool,
    hold_at_least: Option<Duration>,
    continue_on_lost: bool,
    replicas: Option<(u32, Duration)>,
}

fn duration(d: Duration) -> TokenStream {
    let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    quote!(::core::time::Duration::from_millis(#millis))
}

impl Expansion for LockExpansion {
    /// Input: `key = "stock:{sku}", wait = "300ms", fair`.
    /// Output: `::redguard::__private::dist_lock_builder(scope, <key>).fair().wait(300ms)`, a
    /// `LockBuilder` with the key rendered while the parameters are still borrowable, and one
    /// call per argument written (the kind first: it decides which calls exist).
    fn prelude(&self, cx: &Context) -> TokenStream {
        let krate = &cx.krate;
        let scope = expand::scope(self.scope.as_ref(), cx);
        let key = expand::key(krate, &self.key);
        let mut calls = Vec::new();
        match &self.kind {
            None => {}
            Some(LockKind::Semaphore(permits)) => calls.push(quote!(.permits(#permits))),
            Some(LockKind::Read) => calls.push(quote!(.read())),
            Some(LockKind::Write) => calls.push(quote!(.write())),
            Some(LockKind::Fair) => calls.push(quote!(.fair())),
        }
        if let Some(wait) = self.wait {
            let wait = duration(wait);
            calls.push(quote!(.wait(#wait)));
        }
        if let Some(lease) = self.lease {
            let lease = duration(lease);
            calls.push(quote!(.lease(#lease)));
        }
        if self.skip_if_held {
            calls.push(quote!(.skip_if_held()));
        }
        if let Some(hold) = self.hold_at_least {
            let hold = duration(hold);
            calls.push(quote!(.hold_at_least(#hold)));
        }
        if self.continue_on_lost {
            calls.push(quote!(.on_lost(#krate::__private::OnLost::Continue)));
        }
        calls.extend(expand::replicas(self.replicas));
        quote!(#krate::__private::dist_lock_builder(#scope, #key) #(#calls)*)
    }

    /// Input: the body future. Output: `::redguard::__private::dist_lock(builder, body)`.
    /// Spanned at the return type (see [`expand::at_return`]).
    fn wrap(&self, cx: &Context, binding: &Ident, inner: TokenStream) -> TokenStream {
        expand::at_return(cx, quote!(dist_lock), quote!(#binding, #inner))
    }
}
