//! `#[rate_limit]`.

use syn::ItemFn;

use crate::args::{ArgSpec, Args, Kind};
use crate::errors::Errors;
use crate::guard::{Expansion, Guard, arg};

pub(crate) struct RateLimit;

impl Guard for RateLimit {
    const NAME: &'static str = "rate_limit";
    const ARGS: &'static [ArgSpec] = &[
        arg("key", Kind::Template),
        arg("rate", Kind::Rate),
        arg("burst", Kind::Int),
        arg("algorithm", Kind::Str),
        arg("cost", Kind::Expr),
        arg("scope", Kind::Str),
    ];

    fn check(_args: Args, item: &ItemFn, errors: &mut Errors) -> Option<Box<dyn Expansion>> {
        errors.push(
            item.sig.ident.span(),
            format!(
                "`#[{}]` is not implemented yet in this version of redguard",
                Self::NAME
            ),
        );
        None
    }
}
