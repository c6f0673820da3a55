//! `#[dist_lock]`.

use proc_macro2::TokenStream;
use syn::ItemFn;

use crate::args::{ArgSpec, Args, Kind};
use crate::errors::Errors;
use crate::expand;
use crate::guard::{Guard, arg};

pub(crate) struct DistLock;

impl Guard for DistLock {
    const NAME: &'static str = "dist_lock";
    const ARGS: &'static [ArgSpec] = &[
        arg("key", Kind::Template),
        arg("wait", Kind::Duration),
        arg("lease", Kind::Duration),
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
