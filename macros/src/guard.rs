//! The three attributes: their argument tables and the parse → check → expand pipeline.

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use crate::args::{self, ArgSpec, Kind};
use crate::errors::Errors;
use crate::{check, expand};

/// One attribute macro: its name and the arguments it accepts.
pub(crate) struct Guard {
    pub(crate) name: &'static str,
    pub(crate) args: &'static [ArgSpec],
}

const fn arg(name: &'static str, kind: Kind) -> ArgSpec {
    ArgSpec { name, kind }
}

pub(crate) const IDEMPOTENT: Guard = Guard {
    name: "idempotent",
    args: &[
        arg("key", Kind::Template),
        arg("expire", Kind::Duration),
        arg("scope", Kind::Str),
        arg("payload", Kind::Expr),
        arg("timeout", Kind::Duration),
        arg("token", Kind::Template),
        arg("scene", Kind::Str),
    ],
};

pub(crate) const DIST_LOCK: Guard = Guard {
    name: "dist_lock",
    args: &[
        arg("key", Kind::Template),
        arg("wait", Kind::Duration),
        arg("lease", Kind::Duration),
        arg("scope", Kind::Str),
    ],
};

pub(crate) const RATE_LIMIT: Guard = Guard {
    name: "rate_limit",
    args: &[
        arg("key", Kind::Template),
        arg("rate", Kind::Rate),
        arg("burst", Kind::Int),
        arg("algorithm", Kind::Str),
        arg("cost", Kind::Expr),
        arg("scope", Kind::Str),
    ],
};

/// Runs the pipeline. On any error the fn is still emitted unchanged next to the errors, so
/// the rest of the crate type-checks and no cascade of "cannot find fn" follows.
pub(crate) fn expand(guard: &Guard, attr: TokenStream, item: TokenStream) -> TokenStream {
    let item: ItemFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#item #err);
        }
    };
    match check_all(guard, attr, &item) {
        Ok(()) => expand::not_implemented(guard.name, &item),
        Err(err) => {
            let err = err.to_compile_error();
            quote!(#item #err)
        }
    }
}

fn check_all(guard: &Guard, attr: TokenStream, item: &ItemFn) -> syn::Result<()> {
    let mut errors = Errors::new();
    match args::parse(guard.name, guard.args, attr, &mut errors) {
        Ok(args) => {
            check::is_async(guard.name, item, &mut errors);
            check::placeholders(guard.name, &args, item, &mut errors);
            if !args.written("key") {
                errors.push(
                    proc_macro2::Span::call_site(),
                    format!("`#[{}]` needs a `key = \"...\"` template", guard.name),
                );
            }
        }
        Err(err) => errors.push_error(err),
    }
    errors.finish()
}
