//! What every attribute shares: the parse → check → expand pipeline, and stacking.
//!
//! Each attribute is a [`Guard`] in its own module (`idempotent.rs`, `dist_lock.rs`,
//! `rate_limit.rs`): its arguments as a typed struct (`args::arguments!`), a check that turns
//! them into an [`Expansion`] (pushing every problem to [`Errors`]), and the expansion itself,
//! which cannot fail.
//!
//! Stacking: attribute macros expand top-down, each seeing the attributes below it. Left to
//! itself each would wrap the body in turn, so the *last* written guard would run first. To
//! make guards apply outside-in in the order written, the topmost guard expands the whole
//! stack: it takes the redguard attributes below it off the fn and composes every guard's
//! wrapper itself. Adjacent `#[rate_limit]`s become one wrapper deciding all their limits.
//!
//! ```text
//! #[rate_limit(..)]            async fn f(x: X) -> Result<T, E> {
//! #[idempotent(..)]      =>        let __redguard_0 = <rate_limit prelude>;  // keys rendered
//! async fn f(x: X) ..              let __redguard_1 = <idempotent prelude>;  // by reference
//!                                  let __redguard_body = async move { body };
//!                                  wrap_0(wrap_1(__redguard_body)).await
//!                              }
//! ```
//!
//! A guard attribute the stack does not recognise (imported under another name) would expand
//! later, around the already expanded fn, reversing the order; the expansion leaves a marker
//! in the body, and a guard that finds it refuses with an explanation instead.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Ident, LitStr, Signature, Type, Visibility};

use crate::args::{self, Arguments};
use crate::check;
use crate::dist_lock::DistLock;
use crate::errors::Errors;
use crate::expand;
use crate::idempotent::Idempotent;
use crate::rate_limit::{self, RateLimit};

/// One attribute macro.
pub(crate) trait Guard {
    /// Its arguments.
    type Args: Arguments;

    /// Whether `key` must be written (it is, unless a guard has another way to identify the
    /// call, as `#[idempotent]`'s token mode does).
    fn requires_key(_args: &Self::Args) -> bool {
        true
    }

    /// Checks what is specific to this guard and builds its expansion. Called after the
    /// shared checks; every problem goes to `errors`.
    fn check(args: Self::Args, errors: &mut Errors) -> Option<Built>;

    /// Checks what is specific to this guard against the fn's signature.
    fn check_signature(_args: &Self::Args, _sig: &Signature, _errors: &mut Errors) {}
}

/// What one checked guard contributes.
pub(crate) enum Built {
    /// A guard with a wrapper of its own.
    Wrapper(Box<dyn Expansion>),
    /// A `#[rate_limit]`: adjacent ones share one wrapper.
    Limit(Box<rate_limit::RateLimitExpansion>),
}

/// The code one guard with a wrapper of its own contributes.
pub(crate) trait Expansion {
    /// An expression evaluated before the body is moved into its future, bound to `binding`:
    /// render keys and fingerprints here (parameters are still borrowable). Must not fail or
    /// return early: the runtime reports an invalid key when the wrapper runs.
    fn prelude(&self, cx: &Context) -> TokenStream;

    /// An expression wrapping `inner`, a future of the fn's return type, into another future
    /// of that type. `binding` holds what `prelude` produced.
    fn wrap(&self, cx: &Context, binding: &Ident, inner: TokenStream) -> TokenStream;
}

/// What every expansion may refer to.
pub(crate) struct Context {
    /// The runtime crate's path: `::redguard`, or what `crate = "..."` says.
    pub(crate) krate: TokenStream,
    /// An expression of type `&'static str`: the default scope, the fn's path with its impl
    /// type and trait (`shop::Orders::create`, `shop::PgOrders@shop::Store::create`).
    pub(crate) default_scope: TokenStream,
    /// The fn's return type.
    pub(crate) ret: Type,
}

/// The fn a guard is on, with its body kept as tokens: it is only re-emitted, so it is not
/// parsed (as tracing-attributes' `MaybeItemFn` does), which keeps compile times down.
pub(crate) struct GuardedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) body: TokenStream,
}

impl Parse for GuardedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        Ok(GuardedFn {
            attrs: input.call(Attribute::parse_outer)?,
            vis: input.parse()?,
            sig: input.parse()?,
            body: input.parse()?,
        })
    }
}

impl ToTokens for GuardedFn {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let GuardedFn {
            attrs,
            vis,
            sig,
            body,
        } = self;
        tokens.extend(quote!(#(#attrs)* #vis #sig #body));
    }
}

/// The guards, by name.
const GUARDS: [&str; 3] = ["idempotent", "dist_lock", "rate_limit"];

/// A guard attribute written on the fn, recognised by path: `name` or `redguard::name`.
fn guard_name(attr: &Attribute) -> Option<&'static str> {
    let path = attr.path();
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let name = match segments.as_slice() {
        [name] => name,
        [krate, name] if krate == "redguard" => name,
        _ => return None,
    };
    GUARDS.into_iter().find(|known| name == known)
}

/// Parses and checks one guard's arguments against the fn; also returns its `crate = ".."`.
fn check_guard<G: Guard>(
    attr: TokenStream,
    item: &GuardedFn,
    errors: &mut Errors,
) -> (Option<Built>, Option<LitStr>) {
    let args = match args::parse::<G::Args>(attr, errors) {
        Ok(args) => args,
        Err(err) => {
            errors.push_error(err);
            return (None, None);
        }
    };
    let name = G::Args::ATTR;
    check::placeholders(name, &args.templates(), &item.sig, errors);
    if G::requires_key(&args) && !args.written("key") {
        errors.push(
            Span::call_site(),
            format!("`#[{name}]` needs a `key = \"...\"` template"),
        );
    }
    G::check_signature(&args, &item.sig, errors);
    let krate = args.krate().cloned();
    (G::check(args, errors), krate)
}

fn check_named(
    name: &str,
    attr: TokenStream,
    item: &GuardedFn,
    errors: &mut Errors,
) -> (Option<Built>, Option<LitStr>) {
    match name {
        "idempotent" => check_guard::<Idempotent>(attr, item, errors),
        "dist_lock" => check_guard::<DistLock>(attr, item, errors),
        _ => check_guard::<RateLimit>(attr, item, errors),
    }
}

/// The name of the local the expansion binds its body to; also the marker a guard expanded
/// around an already expanded fn finds.
const BODY: &str = "__redguard_body";

/// Runs the pipeline for the topmost guard `G` and every guard stacked below it. On any
/// error the fn is still emitted unchanged next to the errors, so the rest of the crate
/// type-checks and no cascade of "cannot find fn" follows.
pub(crate) fn expand<G: Guard>(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut item: GuardedFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#item #err);
        }
    };
    let mut errors = Errors::new();
    let name = G::Args::ATTR;
    check::is_async(name, &item.sig, &mut errors);
    let ret = check::return_type(name, &item.sig, &mut errors);
    if contains_ident(&item.body, BODY) {
        errors.push(
            Span::call_site(),
            format!(
                "`#[{name}]` is written below a redguard guard that was already expanded, so it \
                 would run first instead of in the order written; this happens when a guard is \
                 imported under another name (`use redguard::{name} as ..`), which the stack \
                 cannot recognise: write it as `#[redguard::{name}(..)]` or import it under its \
                 own name"
            ),
        );
    }

    let mut stacked = Vec::new();
    let mut kept = Vec::new();
    for attr in std::mem::take(&mut item.attrs) {
        match guard_name(&attr) {
            Some(name) => stacked.push((name, attr)),
            None => kept.push(attr),
        }
    }
    item.attrs = kept;

    let mut built = Vec::new();
    let mut krates = Vec::new();
    let (first, krate) = check_named(name, attr, &item, &mut errors);
    built.push((name, first));
    krates.extend(krate);
    for (name, attr) in &stacked {
        let tokens = match &attr.meta {
            syn::Meta::List(list) => list.tokens.clone(),
            _ => TokenStream::new(),
        };
        let (guard, krate) = check_named(name, tokens, &item, &mut errors);
        built.push((name, guard));
        krates.extend(krate);
    }
    let krate = runtime_path(&krates, &mut errors);
    let order = [name]
        .into_iter()
        .chain(stacked.iter().map(|(name, _)| *name))
        .collect::<Vec<_>>();
    rate_limit::same_key_in_one_call(&built, &mut errors);
    rate_limit::charge_stands_alone(&built, &mut errors);

    match (errors.finish(), ret) {
        (Ok(()), Some(ret)) => {
            let built: Option<Vec<Built>> = built.into_iter().map(|(_, b)| b).collect();
            let built = built.expect("every failed check pushed an error");
            let paths: Vec<syn::Path> = stacked.iter().map(|(_, a)| a.path().clone()).collect();
            let warning = order_warning(&order, &krate);
            emit(item, ret, krate, built, &paths, warning)
        }
        (Err(err), _) => {
            let err = err.to_compile_error();
            for (_, attr) in stacked {
                item.attrs.push(attr);
            }
            quote!(#item #err)
        }
        (Ok(()), None) => unreachable!("a failed return-type check pushed an error"),
    }
}

/// Whether `tokens` contain the identifier `name`, at any depth.
fn contains_ident(tokens: &TokenStream, name: &str) -> bool {
    tokens.clone().into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == name,
        TokenTree::Group(group) => contains_ident(&group.stream(), name),
        _ => false,
    })
}

/// `crate = "path"` of the stack (one path for all of it), else `::redguard`.
fn runtime_path(written: &[LitStr], errors: &mut Errors) -> TokenStream {
    let Some(first) = written.first() else {
        return quote!(::redguard);
    };
    for other in &written[1..] {
        if other.value() != first.value() {
            errors.push(
                other.span(),
                format!(
                    "`crate = \"{}\"` differs from `crate = \"{}\"` above: the guards of one fn \
                     run on one runtime",
                    other.value(),
                    first.value()
                ),
            );
        }
    }
    match first.parse::<syn::Path>() {
        Ok(path) => path.into_token_stream(),
        Err(_) => {
            errors.push(
                first.span(),
                "`crate` must be a path to the redguard crate, e.g. `crate = \"::shop::redguard\"`",
            );
            quote!(::redguard)
        }
    }
}

/// A warning (through a deprecated item: the one warning a proc macro can raise on stable)
/// when the stack contradicts the README's recipe: a lock above the idempotency guard takes
/// the lock for replays too, and serialises retries that only need the stored result.
fn order_warning(order: &[&str], krate: &TokenStream) -> TokenStream {
    let lock = order.iter().position(|name| *name == "dist_lock");
    let idem = order.iter().position(|name| *name == "idempotent");
    match (lock, idem) {
        (Some(lock), Some(idem)) if lock < idem => quote! {
            #krate::__private::stack_order::dist_lock_above_idempotent();
        },
        _ => TokenStream::new(),
    }
}

/// Input: a checked fn and its guards, outermost first.
/// Output: the fn with the same signature and attributes, its body wrapped by every guard.
fn emit(
    item: GuardedFn,
    ret: Type,
    krate: TokenStream,
    built: Vec<Built>,
    stacked: &[syn::Path],
    warning: TokenStream,
) -> TokenStream {
    let GuardedFn {
        attrs,
        vis,
        sig,
        body: block,
    } = item;
    let cx = Context {
        krate: krate.clone(),
        default_scope: quote!(__redguard_scope()),
        ret,
    };
    // Adjacent limits become one layer: one wrapper deciding them all-or-nothing.
    let mut layers: Vec<Layer> = Vec::new();
    for guard in built {
        match (guard, layers.last_mut()) {
            (Built::Limit(limit), Some(Layer::Limits(limits))) => limits.push(*limit),
            (Built::Limit(limit), _) => layers.push(Layer::Limits(vec![*limit])),
            (Built::Wrapper(wrapper), _) => layers.push(Layer::Wrapper(wrapper)),
        }
    }
    let mut preludes = Vec::new();
    let mut bindings: Vec<Vec<Ident>> = Vec::new();
    for layer in &layers {
        let mut names = Vec::new();
        let parts: Vec<TokenStream> = match layer {
            Layer::Wrapper(wrapper) => vec![wrapper.prelude(&cx)],
            Layer::Limits(limits) => limits.iter().map(|limit| limit.prelude(&cx)).collect(),
        };
        for prelude in parts {
            let binding = format_ident!("__redguard_{}", preludes.len());
            preludes.push(quote!(let #binding = #prelude;));
            names.push(binding);
        }
        bindings.push(names);
    }
    let ret = &cx.ret;
    // Checked first and at the return type, so a fn returning something other than
    // `Result<T, E: From<redguard::Error>>` gets one error pointing there.
    let ret_check = expand::at_return(&cx, quote!(assert_guarded_return::<#ret>), quote!());
    // The typed `let` gives the async block the fn's return type, so `?` in the body converts
    // errors exactly as it did in the unguarded fn.
    let body_span = block
        .clone()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |tree| tree.span());
    let body = quote_spanned!(body_span=>
        async move {
            let __redguard_ret: #ret = #block;
            __redguard_ret
        }
    );
    let body_ident = Ident::new(BODY, Span::call_site());
    let wrapped =
        layers
            .iter()
            .zip(&bindings)
            .rev()
            .fold(quote!(#body_ident), |inner, (layer, names)| match layer {
                Layer::Wrapper(wrapper) => wrapper.wrap(&cx, &names[0], inner),
                // A limit charged after the call stands alone in its layer.
                Layer::Limits(limits) if limits.iter().any(|l| l.charges_after()) => {
                    expand::at_return(&cx, quote!(rate_limit_charged), quote!(#(#names),*, #inner))
                }
                Layer::Limits(_) => {
                    expand::at_return(&cx, quote!(rate_limit), quote!([#(#names),*], #inner))
                }
            });
    // The future's bounds are checked where it is awaited: at the return type too.
    let awaited = expand::await_at_return(&cx, wrapped);
    quote! {
        #(#attrs)*
        #vis #sig {
            // The stacked attributes were expanded here, not by their own macros: name their
            // paths so the user's `use redguard::idempotent` does not look unused.
            #(#[allow(unused_imports)] use #stacked as _;)*
            // The default scope: an attribute cannot see the impl around its fn, but the
            // compiler's name of an item declared here is the fn's full path.
            #[allow(dead_code)]
            fn __redguard_scope() -> &'static str {
                static SCOPE: #krate::__private::OnceLock<::std::boxed::Box<str>> =
                    #krate::__private::OnceLock::new();
                #krate::__private::default_scope(
                    &SCOPE,
                    ::core::any::type_name_of_val(&__redguard_scope),
                )
            }
            #ret_check;
            #warning
            #(#preludes)*
            #[allow(clippy::let_and_return, clippy::needless_return, unreachable_code)]
            let #body_ident = #body;
            #awaited
        }
    }
}

/// One level of wrapping.
enum Layer {
    Wrapper(Box<dyn Expansion>),
    Limits(Vec<rate_limit::RateLimitExpansion>),
}
