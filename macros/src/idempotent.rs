//! `#[idempotent]`.

use syn::ItemFn;

use crate::args::{ArgSpec, Args, Kind};
use crate::errors::Errors;
use crate::guard::{Expansion, Guard, arg};

pub(crate) struct Idempotent;

impl Guard for Idempotent {
    const NAME: &'static str = "idempotent";
    const ARGS: &'static [ArgSpec] = &[
        arg("key", Kind::Template),
        arg("expire", Kind::Duration),
        arg("scope", Kind::Str),
        arg("payload", Kind::Expr),
        arg("timeout", Kind::Duration),
        arg("token", Kind::Template),
        arg("scene", Kind::Str),
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
