//! `#[rate_limit]`.
//!
//! ```text
//! #[rate_limit(key = "order:user:{user_id}", rate = "5/s", burst = 10, cost = req.items)]
//! ```
//! `rate`, `burst` and `cost` are literals (checked here) or expressions evaluated per call
//! (limits usually come from configuration; the runtime checks those values).
//!
//! Stacking: adjacent `#[rate_limit]`s are decided all-or-nothing in one store call: the
//! pipeline (`guard.rs`) gives them one wrapper, `rate_limit([__redguard_0, __redguard_1], body)`.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, UnOp};

use redguard_grammar::rate as grammar;

use crate::args::{Arguments, Spanned, TemplateArg, arguments};
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Built, Context, Guard};

pub(crate) struct RateLimit;

/// The algorithms by attribute name, with the runtime's variant.
const ALGORITHMS: &[(&str, &str)] = &[
    ("gcra", "Gcra"),
    ("fixed_window", "FixedWindow"),
    ("sliding_window", "SlidingWindow"),
    ("sliding_counter", "SlidingCounter"),
    ("token_bucket", "TokenBucket"),
    ("leaky_bucket", "LeakyBucket"),
];

arguments! {
    /// `#[rate_limit(key = "..", rate = .., burst = .., algorithm = "..", cost = ..,
    /// block = "..", wait = "..", local = bool, shadow = bool, scope = "..", charge = after)]`
    RateArgs for "rate_limit" {
        key: Template,
        rate: Expr,
        burst: Expr,
        algorithm: Str,
        cost: Expr,
        block: Duration,
        wait: Duration,
        local: Expr,
        shadow: Expr,
        scope: Str,
        charge: Expr,
    }
}

impl Guard for RateLimit {
    type Args = RateArgs;

    fn check(args: RateArgs, errors: &mut Errors) -> Option<Built> {
        let algorithm = algorithm(&args, errors);
        let window = algorithm
            .is_some_and(|(name, _)| name.ends_with("window") || name == "sliding_counter");
        let rate = rate(&args, errors);
        let burst = count(args.burst.as_ref(), "burst", errors);
        let cost = count(args.cost.as_ref(), "cost", errors);

        if let (true, Some(Count::Literal(_, span))) = (window, &burst) {
            errors.push(
                *span,
                format!(
                    "`{}` admits the rate's count per period and takes no `burst`; put the \
                     count in `rate` instead",
                    algorithm.map_or("", |(name, _)| name)
                ),
            );
        }
        // The sliding log keeps an entry per call, up to the count: its size is bounded.
        if let (Some(("sliding_window", _)), Some(Arg::Literal(rate)), Some(lit)) =
            (algorithm, &rate, &args.rate)
            && let Err(why) = grammar::window_count(grammar::Shape::Log, *rate)
        {
            errors.push(lit.span(), format!("invalid `rate`: {why}"));
        }
        // Refilling the burst must not take longer than the runtime can count exactly.
        if let (Some(Count::Literal(n, span)), Some(Arg::Literal(rate))) = (&burst, &rate)
            && let Err(why) = grammar::span(*n, *rate)
        {
            errors.push(*span, format!("invalid `burst`: {why}"));
        }
        // The capacity known at compile time: the burst, else the rate's count.
        let capacity = match (&burst, &rate) {
            (Some(Count::Literal(n, _)), _) => Some(*n),
            (None, Some(Arg::Literal(rate))) => Some(rate.count),
            _ => None,
        };
        if let (Some(Count::Literal(cost, span)), Some(capacity)) = (&cost, capacity)
            && let Err(why) = grammar::cost_fits(*cost, capacity)
        {
            errors.push(*span, format!("invalid `cost`: {why}"));
        }
        let block_ms = millis(&args.block, "block", grammar::block, errors);
        let wait_ms = millis(&args.wait, "wait", grammar::wait, errors);
        let local = match literal(args.local.as_ref()) {
            None => false,
            Some((Some(Lit::Bool(b)), _)) => b.value,
            Some((_, expr)) => {
                errors.push(
                    expr.span(),
                    "`local` of `#[rate_limit]` expects `true` or `false`",
                );
                false
            }
        };

        // `shadow = <bool expression>`: evaluated per call, so shadow mode is switched off by
        // configuration; a literal that is not a bool is refused here, under it.
        let shadow = match literal(args.shadow.as_ref()) {
            None | Some((Some(Lit::Bool(_)) | None, _)) => args.shadow.clone(),
            Some((Some(_), expr)) => {
                errors.push(
                    expr.span(),
                    "`shadow` of `#[rate_limit]` expects `true`, `false` or a bool expression \
                     (e.g. `shadow = config.dry_run()`)",
                );
                None
            }
        };

        // `charge = after`: admitted at `cost`, settled with the `Ok` value's `Cost`.
        let charge_after = match args.charge.as_ref().map(peel) {
            None => None,
            Some(Expr::Path(path)) if path.path.is_ident("after") => Some(path.span()),
            Some(other) => {
                errors.push(
                    other.span(),
                    "`charge` of `#[rate_limit]` expects `after`: `charge = after` admits the \
                     call at `cost` and charges or refunds the rest from the `Ok` value's \
                     `redguard::rate::Cost`",
                );
                None
            }
        };

        let key = args.key?;
        // Limits merged into one call are refused at runtime when two share a key: the same
        // template under the same written (or default) scope always does.
        let merged_key = format!(
            "{:?}\0{}",
            args.scope.as_ref().map(LitStr::value),
            key.lit.value()
        );
        Some(Built::Limit(Box::new(RateLimitExpansion {
            key,
            merged_key,
            scope: args.scope,
            rate: rate?,
            burst,
            cost,
            algorithm: algorithm
                .filter(|(name, _)| *name != ALGORITHMS[0].0)
                .map(|(_, variant)| Ident::new(variant, Span::call_site())),
            block_ms,
            wait_ms,
            local,
            shadow,
            charge_after,
        })))
    }
}

/// A duration argument checked by the runtime's own `check`, in ms (0 when not written).
fn millis(
    value: &Option<Spanned<Duration>>,
    name: &str,
    check: fn(Duration) -> Result<(), String>,
    errors: &mut Errors,
) -> u64 {
    match value {
        Some(d) => match check(d.value) {
            Ok(()) => u64::try_from(d.value.as_millis()).unwrap_or(0),
            Err(why) => {
                errors.push(d.span, format!("invalid `{name}`: {why}"));
                0
            }
        },
        None => 0,
    }
}

enum Arg {
    Literal(grammar::Rate),
    Expr(Expr),
}

enum Count {
    Literal(u64, Span),
    Expr(Expr),
}

fn literal(expr: Option<&Expr>) -> Option<(Option<Lit>, Expr)> {
    let expr = expr?;
    let lit = match peel(expr) {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit.clone()),
        _ => None,
    };
    Some((lit, expr.clone()))
}

/// What is under parentheses and invisible groups: a literal passed through a
/// `macro_rules!` arrives grouped, and is checked now like one written directly.
fn peel(mut expr: &Expr) -> &Expr {
    loop {
        expr = match expr {
            Expr::Paren(paren) => &paren.expr,
            Expr::Group(group) => &group.expr,
            _ => return expr,
        };
    }
}

/// `rate = "5/s"` (checked now) or `rate = <expr>` (a `Rate` or text, checked per call).
fn rate(args: &RateArgs, errors: &mut Errors) -> Option<Arg> {
    let Some((lit, expr)) = literal(args.rate.as_ref()) else {
        if !args.written("rate") {
            errors.push(
                Span::call_site(),
                "`#[rate_limit]` needs a `rate = \"...\"`, e.g. `rate = \"100/s\"`",
            );
        }
        return None;
    };
    match lit {
        Some(Lit::Str(lit)) => match grammar::parse(&lit.value()) {
            Ok(rate) => Some(Arg::Literal(rate)),
            Err(message) => {
                errors.push(lit.span(), format!("invalid `rate`: {message}"));
                None
            }
        },
        Some(other) => {
            errors.push(
                other.span(),
                "`rate` of `#[rate_limit]` expects a rate string such as \"100/s\", or an \
                 expression giving a `redguard::rate::Rate` or such a string",
            );
            None
        }
        None => Some(Arg::Expr(expr)),
    }
}

/// `burst`/`cost`: an integer literal (checked now) or an expression (checked per call).
fn count(expr: Option<&Expr>, name: &str, errors: &mut Errors) -> Option<Count> {
    let (lit, expr) = literal(expr)?;
    match lit {
        Some(Lit::Int(lit)) => match lit.base10_parse::<u64>() {
            Ok(n) => {
                let checked = if name == "burst" {
                    grammar::burst(n)
                } else {
                    grammar::cost(n)
                };
                match checked {
                    Ok(()) => Some(Count::Literal(n, lit.span())),
                    Err(why) => {
                        errors.push(lit.span(), format!("invalid `{name}`: {why}"));
                        None
                    }
                }
            }
            Err(_) => {
                errors.push(
                    lit.span(),
                    format!("`{name}` must be a non-negative integer"),
                );
                None
            }
        },
        Some(other) => {
            errors.push(
                other.span(),
                format!("`{name}` of `#[rate_limit]` expects an integer or an expression"),
            );
            None
        }
        // `-1`: an expression to syn, refused by the runtime on every call.
        None if matches!(peel(&expr), Expr::Unary(ExprUnary { op: UnOp::Neg(_), expr: inner, .. })
            if matches!(peel(inner), Expr::Lit(ExprLit { lit: Lit::Int(_), .. }))) =>
        {
            errors.push_error(syn::Error::new_spanned(
                &expr,
                format!("`{name}` must be a non-negative integer"),
            ));
            None
        }
        None => Some(Count::Expr(expr)),
    }
}

fn algorithm(args: &RateArgs, errors: &mut Errors) -> Option<(&'static str, &'static str)> {
    let Some(lit) = &args.algorithm else {
        return Some(ALGORITHMS[0]);
    };
    let name = lit.value();
    let found = ALGORITHMS.iter().find(|(known, _)| *known == name).copied();
    if found.is_none() {
        let names: Vec<String> = ALGORITHMS.iter().map(|(n, _)| format!("`{n}`")).collect();
        errors.push(
            lit.span(),
            format!(
                "unknown rate-limit algorithm `{name}`; expected one of {}",
                names.join(", ")
            ),
        );
    }
    found
}

/// Adjacent `#[rate_limit]`s are decided in one store call, which refuses two limits on one
/// key (`Error::InvalidLimit` on every call); with the same template and scope that is known
/// now. Each repeat is reported at its template.
pub(crate) fn same_key_in_one_call(stack: &[(&str, Option<Built>)], errors: &mut Errors) {
    let mut merged: Vec<&str> = Vec::new();
    for (_, built) in stack {
        let Some(Built::Limit(limit)) = built else {
            merged.clear();
            continue;
        };
        if merged.contains(&limit.merged_key.as_str()) {
            errors.push(
                limit.key.lit.span(),
                "this `#[rate_limit]` has the same key and scope as one stacked right next to \
                 it; adjacent limits are decided together and two on one key are refused on \
                 every call: give it another key or `scope`",
            );
        }
        merged.push(&limit.merged_key);
    }
}

/// `charge = after` settles one limit's cost after the body; adjacent limits are decided and
/// charged together, so a charged-after limit must stand alone. Reported at each `charge`.
pub(crate) fn charge_stands_alone(stack: &[(&str, Option<Built>)], errors: &mut Errors) {
    let is_limit = |i: usize| matches!(stack.get(i), Some((_, Some(Built::Limit(_)))));
    for (i, (_, built)) in stack.iter().enumerate() {
        let Some(Built::Limit(limit)) = built else {
            continue;
        };
        if let Some(span) = limit.charge_after
            && ((i > 0 && is_limit(i - 1)) || is_limit(i + 1))
        {
            errors.push(
                span,
                "`charge = after` settles the cost of one limit, but this `#[rate_limit]` is \
                 stacked right next to another and adjacent limits are decided together: \
                 put another attribute between them, or charge this one up front",
            );
        }
    }
}

/// One `#[rate_limit]`, checked.
pub(crate) struct RateLimitExpansion {
    key: TemplateArg,
    /// The written scope and the template text.
    merged_key: String,
    scope: Option<LitStr>,
    rate: Arg,
    burst: Option<Count>,
    cost: Option<Count>,
    /// The runtime's variant, when not the default.
    algorithm: Option<Ident>,
    block_ms: u64,
    wait_ms: u64,
    local: bool,
    /// `shadow = ..` as written (a bool literal or expression).
    shadow: Option<Expr>,
    /// Where `charge = after` was written, if it was.
    charge_after: Option<Span>,
}

impl RateLimitExpansion {
    /// Whether the cost is settled after the body (`charge = after`).
    pub(crate) fn charges_after(&self) -> bool {
        self.charge_after.is_some()
    }

    /// Output: `::redguard::__private::rate_limiter(<key>, <scope>, <rate>).burst(10)`, one
    /// call per argument written (`rate_cost(<that>, rate_count(<expr>, "cost"))` for a value
    /// checked per call), every expression evaluated before the body is moved. The wrapper of
    /// adjacent limits is `guard.rs`'s.
    pub(crate) fn prelude(&self, cx: &Context) -> TokenStream {
        let krate = &cx.krate;
        let key = expand::key(krate, &self.key);
        let scope = expand::scope(self.scope.as_ref(), cx);
        let rate = match &self.rate {
            Arg::Literal(rate) => {
                let count = rate.count;
                let period_ms = u64::try_from(rate.period.as_millis()).unwrap_or(u64::MAX);
                quote!(#krate::__private::Rate::__checked(#count, #period_ms))
            }
            Arg::Expr(expr) => quote_spanned!(expr.span()=> #expr),
        };
        let mut limiter = quote!(#krate::__private::rate_limiter(#key, #scope, #rate));
        for (name, count) in [("burst", &self.burst), ("cost", &self.cost)] {
            match count {
                None => {}
                Some(Count::Literal(n, _)) => {
                    let method = Ident::new(name, Span::call_site());
                    limiter = quote!(#limiter.#method(#n));
                }
                // Checked per call: a bad value is kept and reported when the limit runs.
                Some(Count::Expr(expr)) => {
                    let set = Ident::new(&format!("rate_{name}"), Span::call_site());
                    let value = quote_spanned!(expr.span()=>
                        #krate::__private::rate_count(#expr, #name)
                    );
                    limiter = quote!(#krate::__private::#set(#limiter, #value));
                }
            }
        }
        if let Some(variant) = &self.algorithm {
            limiter = quote!(#limiter.algorithm(#krate::__private::Algorithm::#variant));
        }
        let ms = |ms: u64| quote!(::core::time::Duration::from_millis(#ms));
        if self.block_ms > 0 {
            let block = ms(self.block_ms);
            limiter = quote!(#limiter.block(#block));
        }
        if self.wait_ms > 0 {
            let wait = ms(self.wait_ms);
            limiter = quote!(#limiter.wait(#wait));
        }
        if self.local {
            limiter = quote!(#limiter.local(true));
        }
        if let Some(shadow) = &self.shadow {
            let shadow = quote_spanned!(shadow.span()=> #shadow);
            limiter = quote!(#limiter.shadow(#shadow));
        }
        limiter
    }
}
