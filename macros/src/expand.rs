//! Quoting shared by the guards' expansions. Nothing here fails: every check ran before.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens as _, quote, quote_spanned};
use syn::{Ident, Index, LitStr};

use crate::args::TemplateArg;
use crate::guard::Context;
use crate::template::Segment;

/// Input: `"stock:{sku}"`.
/// Output: an expression of type `redguard::Result<KeyBody>`:
/// `KeyBuilder::new().text("stock:").part("sku", key_part(&sku)).finish()`, each `key_part`
/// spanned at its placeholder so a value that is not `KeyPart` is reported there.
pub(crate) fn key(krate: &TokenStream, template: &TemplateArg) -> TokenStream {
    let steps = template.segments.iter().map(|segment| match segment {
        Segment::Text { text, .. } => quote!(.text(#text)),
        Segment::Placeholder {
            root,
            fields,
            range,
        } => {
            let span = template.span_of(range.clone());
            let root = if root == "self" {
                quote_spanned!(span=> self)
            } else {
                let ident = Ident::new(root, span);
                quote!(#ident)
            };
            let fields = fields.iter().map(|field| match field.parse::<u32>() {
                Ok(index) => {
                    let index = Index { index, span };
                    quote!(.#index)
                }
                Err(_) => {
                    let ident = Ident::new(field, span);
                    quote!(.#ident)
                }
            });
            let name = template.lit.value()[range.start + 1..range.end - 1].to_owned();
            // The runtime's path at the placeholder too, so the whole call is spanned there and
            // a type error is reported once, under the placeholder.
            let krate = respan(krate, span);
            quote_spanned!(span=>
                .part(#name, #krate::__private::key_part(&#root #(#fields)*))
            )
        }
    });
    quote!(#krate::__private::KeyBuilder::new() #(#steps)* .finish())
}

/// The `scope = "..."` the user wrote, or the fn's path (impl type and trait included).
pub(crate) fn scope(written: Option<&LitStr>, cx: &Context) -> TokenStream {
    match written {
        Some(lit) => quote!(#lit),
        None => cx.default_scope.clone(),
    }
}

/// `<runtime>::__private::<callee>(args)` spanned at the fn's return type (its first
/// token): every wrapper call and return-type check is spanned there, and rustc reports an
/// unmet predicate once per span, so an error type without `From<redguard::Error>` (or
/// `Classify`) gets one error at the return type, not one per wrapper inside the expansion.
pub(crate) fn at_return(cx: &Context, callee: TokenStream, args: TokenStream) -> TokenStream {
    let at = return_span(&cx.ret);
    let krate = &cx.krate;
    let path = respan(&quote!(#krate::__private::#callee), at);
    let mut args = Group::new(Delimiter::Parenthesis, args);
    args.set_span(at);
    quote!(#path #args)
}

/// `expr.await`, spanned as [`at_return`] spans its calls: the future's bounds are checked
/// where it is awaited.
pub(crate) fn await_at_return(cx: &Context, expr: TokenStream) -> TokenStream {
    let at = return_span(&cx.ret);
    quote_spanned!(at=> #expr.await)
}

/// The span of the first token of `ty`. One span for every check: a stable proc macro cannot
/// join spans, and calls spanned from one token to another are not "the same span" to rustc.
fn return_span(ty: &syn::Type) -> Span {
    ty.to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| token.span())
}

/// Whether the return type names the `anyhow` crate (`anyhow::Result<T>`,
/// `Result<T, anyhow::Error>`): then a missing `Classify` means the feature is off.
pub(crate) fn names_anyhow(ty: &syn::Type) -> bool {
    let syn::Type::Path(path) = ty else {
        return false;
    };
    path.path.segments.iter().any(|segment| {
        segment.ident == "anyhow"
            || match &segment.arguments {
                syn::PathArguments::AngleBracketed(args) => args
                    .args
                    .iter()
                    .any(|arg| matches!(arg, syn::GenericArgument::Type(ty) if names_anyhow(ty))),
                _ => false,
            }
    })
}

/// `tokens` with every token at `span`.
fn respan(tokens: &TokenStream, span: proc_macro2::Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|mut token| {
            token.set_span(span);
            token
        })
        .collect()
}

/// Input: `replicas = 1, replicas_timeout = "50ms"` (checked).
/// Output: `.replicas(1, Duration::from_millis(50))`, a builder call of every guard that
/// confirms its writes.
pub(crate) fn replicas(replicas: Option<(u32, std::time::Duration)>) -> Option<TokenStream> {
    replicas.map(|(count, timeout)| {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        quote!(.replicas(#count, ::core::time::Duration::from_millis(#ms)))
    })
}
