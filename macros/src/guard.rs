//! What every attribute shares: the parse → check → expand pipeline, and stacking.
//!
//! Each attribute is a [`Guard`] in its own module (`idempotent.rs`, `dist_lock.rs`,
//! `rate_limit.rs`): an argument table, a check that turns the parsed arguments into an
//! [`Expansion`] (pushing every problem to [`Errors`]), and the expansion itself, which cannot
//! fail.
//!
//! Stacking: attribute macros expand top-down, each seeing the attributes below it. Left to
//! itself each would wrap the body in turn, so the *last* written guard would run first. To
//! make guards apply outside-in in the order written, the topmost guard expands the whole
//! stack: it takes the redguard attributes below it off the fn and composes every guard's
//! wrapper itself.
//!
//! ```text
//! #[rate_limit(..)]            async fn f(x: X) -> Result<T, E> {
//! #[idempotent(..)]      =>        let __redguard_0 = <rate_limit prelude>;  // keys rendered
//! async fn f(x: X) ..              let __redguard_1 = <idempotent prelude>;  // by reference
//!                                  let __redguard_body = async move { body };
//!                                  wrap_0(wrap_1(__redguard_body)).await
//!                              }
//! ```

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned as _;
use syn::{Attribute, Ident, ItemFn, Type};

use crate::args::{self, ArgSpec, Args};
use crate::check;
use crate::dist_lock::DistLock;
use crate::errors::Errors;
use crate::idempotent::Idempotent;
use crate::rate_limit::RateLimit;

/// One attribute macro.
pub(crate) trait Guard {
    /// The attribute's name, for messages and for recognising it in a stack.
    const NAME: &'static str;
    /// The arguments it accepts.
    const ARGS: &'static [ArgSpec];

    /// Whether `key` must be written (it is, unless a guard has another way to identify the
    /// call, as `#[idempotent]`'s token mode does).
    fn requires_key(_args: &Args) -> bool {
        true
    }

    /// Checks what is specific to this guard and builds its expansion. Called after the
    /// shared checks; every problem goes to `errors`.
    fn check(args: Args, item: &ItemFn, errors: &mut Errors) -> Option<Box<dyn Expansion>>;
}

/// The code one checked guard contributes.
pub(crate) trait Expansion {
    /// An expression evaluated before the body is moved into its future, bound to `binding`:
    /// render keys and fingerprints here (parameters are still borrowable). Must not fail or
    /// return early: the runtime reports an invalid key when the wrapper runs.
    fn prelude(&self, cx: &Context) -> TokenStream;

    /// An expression wrapping `inner`, a future of the fn's return type, into another future
    /// of that type. `binding` holds what `prelude` produced.
    fn wrap(&self, cx: &Context, binding: &Ident, inner: TokenStream) -> TokenStream;

    /// For guards merged with adjacent ones of their kind (`#[rate_limit]`): what makes two
    /// of them address the same key on every call, and where to point when they do.
    fn merged_key(&self) -> Option<(String, Span)> {
        None
    }
}

/// What every expansion may refer to.
pub(crate) struct Context {
    /// An expression of type `&'static str`: the default scope, the fn's path with its impl
    /// type and trait (`shop::Orders::create`, `shop::PgOrders@shop::Store::create`).
    pub(crate) default_scope: TokenStream,
    /// The fn's return type.
    pub(crate) ret: Type,
}

pub(crate) const fn arg(name: &'static str, kind: args::Kind) -> ArgSpec {
    ArgSpec { name, kind }
}

/// A guard attribute written on the fn, recognised by path: `name` or `redguard::name`.
fn guard_name(attr: &Attribute) -> Option<&'static str> {
    let path = attr.path();
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let name = match segments.as_slice() {
        [name] => name,
        [krate, name] if krate == "redguard" => name,
        _ => return None,
    };
    [Idempotent::NAME, DistLock::NAME, RateLimit::NAME]
        .into_iter()
        .find(|known| name == known)
}

/// Parses and checks one guard's arguments against the fn.
fn check_guard<G: Guard>(
    attr: TokenStream,
    item: &ItemFn,
    errors: &mut Errors,
) -> Option<Box<dyn Expansion>> {
    let args = match args::parse(G::NAME, G::ARGS, attr, errors) {
        Ok(args) => args,
        Err(err) => {
            errors.push_error(err);
            return None;
        }
    };
    check::placeholders(G::NAME, &args, item, errors);
    if G::requires_key(&args) && !args.written("key") {
        errors.push(
            Span::call_site(),
            format!("`#[{}]` needs a `key = \"...\"` template", G::NAME),
        );
    }
    G::check(args, item, errors)
}

fn check_named(
    name: &str,
    attr: TokenStream,
    item: &ItemFn,
    errors: &mut Errors,
) -> Option<Box<dyn Expansion>> {
    match name {
        Idempotent::NAME => check_guard::<Idempotent>(attr, item, errors),
        DistLock::NAME => check_guard::<DistLock>(attr, item, errors),
        _ => check_guard::<RateLimit>(attr, item, errors),
    }
}

/// Runs the pipeline for the topmost guard `G` and every guard stacked below it. On any
/// error the fn is still emitted unchanged next to the errors, so the rest of the crate
/// type-checks and no cascade of "cannot find fn" follows.
pub(crate) fn expand<G: Guard>(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut item: ItemFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#item #err);
        }
    };
    let mut errors = Errors::new();
    check::is_async(G::NAME, &item, &mut errors);
    let ret = check::return_type(G::NAME, &item, &mut errors);

    let mut stacked = Vec::new();
    let mut kept = Vec::new();
    for attr in std::mem::take(&mut item.attrs) {
        match guard_name(&attr) {
            Some(name) => stacked.push((name, attr)),
            None => kept.push(attr),
        }
    }
    item.attrs = kept;

    let mut expansions = Vec::new();
    expansions.push(check_named(G::NAME, attr, &item, &mut errors));
    for (name, attr) in &stacked {
        let tokens = match &attr.meta {
            syn::Meta::List(list) => list.tokens.clone(),
            _ => TokenStream::new(),
        };
        expansions.push(check_named(name, tokens, &item, &mut errors));
    }

    crate::rate_limit::same_key_in_one_call(&expansions, &mut errors);

    match (errors.finish(), ret) {
        (Ok(()), Some(ret)) => {
            let expansions: Option<Vec<_>> = expansions.into_iter().collect();
            let expansions = expansions.expect("every failed check pushed an error");
            let paths: Vec<syn::Path> = stacked.iter().map(|(_, a)| a.path().clone()).collect();
            emit(item, ret, &expansions, &paths)
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

/// Input: a checked fn and its guards, outermost first.
/// Output: the fn with the same signature and attributes, its body wrapped by every guard.
fn emit(
    item: ItemFn,
    ret: Type,
    expansions: &[Box<dyn Expansion>],
    stacked: &[syn::Path],
) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = item;
    let cx = Context {
        default_scope: quote!(__redguard_scope()),
        ret,
    };
    let bindings: Vec<Ident> = (0..expansions.len())
        .map(|i| format_ident!("__redguard_{}", i))
        .collect();
    let preludes = expansions
        .iter()
        .zip(&bindings)
        .map(|(expansion, binding)| {
            let prelude = expansion.prelude(&cx);
            quote!(let #binding = #prelude;)
        });
    let ret = &cx.ret;
    // Checked first and at the return type, so a fn returning something other than
    // `Result<T, E: From<redguard::Error>>` gets one error pointing there.
    let ret_check = quote_spanned!(ret.span()=>
        ::redguard::__private::assert_guarded_return::<#ret>();
    );
    // The typed `let` gives the async block the fn's return type, so `?` in the body converts
    // errors exactly as it did in the unguarded fn.
    let body = quote_spanned!(block.span()=>
        async move {
            let __redguard_ret: #ret = #block;
            __redguard_ret
        }
    );
    let wrapped = expansions
        .iter()
        .zip(&bindings)
        .rev()
        .fold(quote!(__redguard_body), |inner, (expansion, binding)| {
            expansion.wrap(&cx, binding, inner)
        });
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
                static SCOPE: ::redguard::__private::OnceLock<::std::boxed::Box<str>> =
                    ::redguard::__private::OnceLock::new();
                ::redguard::__private::default_scope(
                    &SCOPE,
                    ::core::any::type_name_of_val(&__redguard_scope),
                )
            }
            #ret_check
            #(#preludes)*
            #[allow(clippy::let_and_return, clippy::needless_return, unreachable_code)]
            let __redguard_body = #body;
            #wrapped.await
        }
    }
}
