//! `#[rate_limit]`.

use proc_macro2::TokenStream;
use syn::ItemFn;

use crate::args::{ArgSpec, Args, Kind};
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Guard, arg};

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
    type Checked = ();

    fn check(_args: Args, _item: &ItemFn, _errors: &mut Errors) -> Option<()> {
        Some(())
    }

    fn expand((): (), item: ItemFn) -> TokenStream {
        expand::not_implemented(Self::NAME, &item)
    }
}
