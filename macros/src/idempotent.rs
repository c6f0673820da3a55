//! `#[idempotent]`.

use proc_macro2::TokenStream;
use syn::ItemFn;

use crate::args::{ArgSpec, Args, Kind};
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Guard, arg};

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
    type Checked = ();

    fn check(_args: Args, _item: &ItemFn, _errors: &mut Errors) -> Option<()> {
        Some(())
    }

    fn expand((): (), item: ItemFn) -> TokenStream {
        expand::not_implemented(Self::NAME, &item)
    }
}
