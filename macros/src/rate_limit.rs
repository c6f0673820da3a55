//! `#[rate_limit]`.
//!
//! ```text
//! #[rate_limit(key = "order:user:{user_id}", rate = "5/s", burst = 10, cost = req.items)]
//! ```
//! `rate`, `burst` and `cost` are literals (checked here) or expressions evaluated per call
//! (limits usually come from configuration; the runtime checks those values).
//!
//! Stacking: adjacent `#[rate_limit]`s are decided all-or-nothing in one store call. The
//! pipeline wraps inside-out, so when a rate-limit wrapper finds that `inner` is itself a
//! rate-limit call, it adds its limit to that call instead of wrapping it:
//!
//! ```text
//! rate_limit([__redguard_1], body)  --outer limit-->  rate_limit([__redguard_0, __redguard_1], body)
//! ```

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{Expr, ExprArray, ExprCall, ExprLit, ExprUnary, Ident, ItemFn, Lit, LitStr, UnOp};

use crate::args::{ArgSpec, Args, Kind};
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Context, Expansion, Guard, arg};
use redguard_grammar::rate as grammar;

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

impl Guard for RateLimit {
    const NAME: &'static str = "rate_limit";
    const ARGS: &'static [ArgSpec] = &[
        arg("key", Kind::Template),
        arg("rate", Kind::Expr),
        arg("burst", Kind::Expr),
        arg("algorithm", Kind::Str),
        arg("cost", Kind::Expr),
        arg("block", Kind::Duration),
        arg("wait", Kind::Duration),
        arg("local", Kind::Expr),
        arg("scope", Kind::Str),
    ];

    fn check(args: Args, _item: &ItemFn, errors: &mut Errors) -> Option<Box<dyn Expansion>> {
        let algorithm = algorithm(&args, errors);
        let window = algorithm
            .is_some_and(|(name, _)| name.ends_with("window") || name == "sliding_counter");
        let rate = rate(&args, errors);
        let burst = count(&args, "burst", errors);
        let cost = count(&args, "cost", errors);

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
            (algorithm, &rate, args.expr("rate"))
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
        let block_ms = millis(&args, "block", grammar::block, errors);
        let wait_ms = millis(&args, "wait", grammar::wait, errors);
        let local = match literal(&args, "local") {
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

        let template = args.template("key")?;
        let key = expand::key(template);
        // Limits merged into one call are refused at runtime when two share a key: the same
        // template under the same written (or default) scope always does.
        let merged_key = (
            format!(
                "{:?}\0{}",
                args.str("scope").map(LitStr::value),
                template.lit.value()
            ),
            template.lit.span(),
        );
        let rate = match rate? {
            Arg::Literal(rate) => {
                let count = rate.count;
                let period_ms = u64::try_from(rate.period.as_millis()).unwrap_or(u64::MAX);
                quote!(::redguard::__private::Rate::__checked(#count, #period_ms))
            }
            Arg::Expr(expr) => quote_spanned!(expr.span()=> #expr),
        };
        // Only what the user wrote, as calls on the limiter: `.burst(..)`, `.cost(..)`, ...
        let mut options = Vec::new();
        for (name, count) in [("burst", burst), ("cost", cost)] {
            match count {
                None => {}
                Some(Count::Literal(n, _)) => {
                    let method = Ident::new(name, Span::call_site());
                    options.push(Step::Method(quote!(.#method(#n))));
                }
                // Checked per call: a bad value is kept and reported when the limit runs.
                Some(Count::Expr(expr)) => {
                    let set = Ident::new(&format!("rate_{name}"), Span::call_site());
                    let value = quote_spanned!(expr.span()=>
                        ::redguard::__private::rate_count(#expr, #name)
                    );
                    options.push(Step::Wrap(quote!(::redguard::__private::#set), value));
                }
            }
        }
        if let Some((name, variant)) = algorithm
            && name != ALGORITHMS[0].0
        {
            let variant = Ident::new(variant, Span::call_site());
            options.push(Step::Method(quote!(
                .algorithm(::redguard::__private::Algorithm::#variant)
            )));
        }
        if block_ms > 0 {
            options.push(Step::Method(quote!(
                .block(::core::time::Duration::from_millis(#block_ms))
            )));
        }
        if wait_ms > 0 {
            options.push(Step::Method(quote!(
                .wait(::core::time::Duration::from_millis(#wait_ms))
            )));
        }
        if local {
            options.push(Step::Method(quote!(.local(true))));
        }
        Some(Box::new(RateLimitExpansion {
            key,
            merged_key,
            scope: args.str("scope").cloned(),
            rate,
            options,
        }))
    }
}

/// A duration argument checked by the runtime's own `check`, in ms (0 when not written).
fn millis(
    args: &Args,
    name: &str,
    check: fn(Duration) -> Result<(), String>,
    errors: &mut Errors,
) -> u64 {
    match args.duration(name) {
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

fn literal(args: &Args, name: &str) -> Option<(Option<Lit>, Expr)> {
    let expr = args.expr(name)?;
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
fn rate(args: &Args, errors: &mut Errors) -> Option<Arg> {
    let Some((lit, expr)) = literal(args, "rate") else {
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
                 expression giving a `redguard::Rate` or such a string",
            );
            None
        }
        None => Some(Arg::Expr(expr)),
    }
}

/// `burst`/`cost`: an integer literal (checked now) or an expression (checked per call).
fn count(args: &Args, name: &str, errors: &mut Errors) -> Option<Count> {
    let (lit, expr) = literal(args, name)?;
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

fn algorithm(args: &Args, errors: &mut Errors) -> Option<(&'static str, &'static str)> {
    let Some(lit) = args.str("algorithm") else {
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
pub(crate) fn same_key_in_one_call(expansions: &[Option<Box<dyn Expansion>>], errors: &mut Errors) {
    let mut merged: Vec<String> = Vec::new();
    for expansion in expansions {
        let Some((key, span)) = expansion.as_ref().and_then(|e| e.merged_key()) else {
            merged.clear();
            continue;
        };
        if merged.contains(&key) {
            errors.push(
                span,
                "this `#[rate_limit]` has the same key and scope as one stacked right next to \
                 it; adjacent limits are decided together and two on one key are refused on \
                 every call: give it another key or `scope`",
            );
        }
        merged.push(key);
    }
}

struct RateLimitExpansion {
    key: TokenStream,
    /// The written scope and the template text, and the template's span.
    merged_key: (String, Span),
    scope: Option<LitStr>,
    rate: TokenStream,
    /// One step per argument written.
    options: Vec<Step>,
}

/// One argument applied to the limiter.
enum Step {
    /// `.burst(10)`, `.algorithm(..)`, …
    Method(TokenStream),
    /// `rate_burst(<limiter>, <value>)`: a value checked per call.
    Wrap(TokenStream, TokenStream),
}

impl Expansion for RateLimitExpansion {
    /// Output: `::redguard::__private::rate_limiter(<key>, <scope>, <rate>).burst(10)` (and
    /// `rate_cost(<that>, rate_count(<expr>, "cost"))` for an expression), every expression
    /// evaluated before the body is moved.
    fn prelude(&self, cx: &Context) -> TokenStream {
        let RateLimitExpansion {
            key, rate, options, ..
        } = self;
        let scope = expand::scope(self.scope.as_ref(), cx);
        let start = quote!(::redguard::__private::rate_limiter(#key, #scope, #rate));
        options.iter().fold(start, |limiter, step| match step {
            Step::Method(call) => quote!(#limiter #call),
            Step::Wrap(set, value) => quote!(#set(#limiter, #value)),
        })
    }

    /// Output: `::redguard::__private::rate_limit([binding, ..], inner)`, merged with an
    /// `inner` that is already such a call (adjacent limits are decided together).
    fn wrap(&self, _cx: &Context, binding: &Ident, inner: TokenStream) -> TokenStream {
        if let Ok(Expr::Call(call)) = syn::parse2::<Expr>(inner.clone())
            && let Some((mut specs, body)) = rate_limit_call(&call)
        {
            specs.elems.insert(0, syn::parse_quote!(#binding));
            return quote!(::redguard::__private::rate_limit(#specs, #body));
        }
        quote!(::redguard::__private::rate_limit([#binding], #inner))
    }

    fn merged_key(&self) -> Option<(String, Span)> {
        Some(self.merged_key.clone())
    }
}

/// Recognises what [`RateLimitExpansion::wrap`] emits: `(specs array, inner future)`.
fn rate_limit_call(call: &ExprCall) -> Option<(ExprArray, Expr)> {
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    let names: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if path.path.leading_colon.is_none() || names != ["redguard", "__private", "rate_limit"] {
        return None;
    }
    let mut args = call.args.iter();
    let (Some(Expr::Array(specs)), Some(body), None) = (args.next(), args.next(), args.next())
    else {
        return None;
    };
    Some((specs.clone(), body.clone()))
}
