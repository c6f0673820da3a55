//! Accumulates every error of one expansion so a build reports all of them at once.

use std::fmt::Display;

use proc_macro2::Span;

/// Collects spanned errors; [`Errors::finish`] folds them into one `syn::Error`.
///
/// Dropping it without calling `finish` is a bug in this crate (errors would be lost), so
/// `Drop` panics then, as serde's `Ctxt` does.
pub(crate) struct Errors {
    errors: Option<Vec<syn::Error>>,
}

impl Errors {
    pub(crate) fn new() -> Self {
        Errors {
            errors: Some(Vec::new()),
        }
    }

    pub(crate) fn push(&mut self, span: Span, message: impl Display) {
        self.push_error(syn::Error::new(span, message));
    }

    pub(crate) fn push_error(&mut self, error: syn::Error) {
        if let Some(errors) = &mut self.errors {
            errors.push(error);
        }
    }

    /// `Ok` when nothing was pushed; otherwise every error, combined.
    pub(crate) fn finish(mut self) -> syn::Result<()> {
        let errors = self.errors.take().unwrap_or_default();
        let mut iter = errors.into_iter();
        match iter.next() {
            None => Ok(()),
            Some(mut first) => {
                first.extend(iter);
                Err(first)
            }
        }
    }
}

impl Drop for Errors {
    fn drop(&mut self) {
        if self.errors.is_some() && !std::thread::panicking() {
            panic!("redguard-macros: `Errors` dropped without `finish()`");
        }
    }
}
