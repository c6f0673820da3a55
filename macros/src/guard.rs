//! What every attribute shares: the parse → check → expand pipeline.
//!
//! Each attribute is a [`Guard`] in its own module (`idempotent.rs`, `dist_lock.rs`,
//! `rate_limit.rs`): an argument table, a conversion of the parsed arguments into its typed
//! arguments (pushing every problem to [`Errors`]), and an expansion that cannot fail.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::ItemFn;

use crate::args::{self, ArgSpec, Args};
use crate::check;
use crate::errors::Errors;

/// One attribute macro.
pub(crate) trait Guard {
    /// The attribute's name, for messages.
    const NAME: &'static str;
    /// The arguments it accepts.
    const ARGS: &'static [ArgSpec];
    /// Its arguments, typed and checked.
    type Checked;

    /// Checks what is specific to this guard and builds its typed arguments. Called only
    /// when the shared checks could run; every problem goes to `errors`.
    fn check(args: Args, item: &ItemFn, errors: &mut Errors) -> Option<Self::Checked>;

    /// Emits the guarded fn. Never fails: everything was checked.
    fn expand(checked: Self::Checked, item: ItemFn) -> TokenStream;
}

pub(crate) const fn arg(name: &'static str, kind: args::Kind) -> ArgSpec {
    ArgSpec { name, kind }
}

/// Runs the pipeline. On any error the fn is still emitted unchanged next to the errors, so
/// the rest of the crate type-checks and no cascade of "cannot find fn" follows.
pub(crate) fn expand<G: Guard>(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item: ItemFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#item #err);
        }
    };
    let mut errors = Errors::new();
    let checked = match args::parse(G::NAME, G::ARGS, attr, &mut errors) {
        Ok(args) => {
            check::is_async(G::NAME, &item, &mut errors);
            check::placeholders(G::NAME, &args, &item, &mut errors);
            if !args.written("key") {
                errors.push(
                    Span::call_site(),
                    format!("`#[{}]` needs a `key = \"...\"` template", G::NAME),
                );
            }
            G::check(args, &item, &mut errors)
        }
        Err(err) => {
            errors.push_error(err);
            None
        }
    };
    match (errors.finish(), checked) {
        (Ok(()), Some(checked)) => G::expand(checked, item),
        (Err(err), _) => {
            let err = err.to_compile_error();
            quote!(#item #err)
        }
        (Ok(()), None) => unreachable!("a guard's check returned None without an error"),
    }
}
