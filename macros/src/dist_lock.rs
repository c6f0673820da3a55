//! `#[dist_lock]`.

use syn::ItemFn;

use crate::args::{ArgSpec, Args, Kind};
use crate::errors::Errors;
use crate::guard::{Expansion, Guard, arg};

pub(crate) struct DistLock;

impl Guard for DistLock {
    const NAME: &'static str = "dist_lock";
    const ARGS: &'static [ArgSpec] = &[
        arg("key", Kind::Template),
        arg("wait", Kind::Duration),
        arg("lease", Kind::Duration),
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
