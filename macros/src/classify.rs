//! `#[derive(Classify)]`: which errors of a type leave an idempotent execution's outcome
//! unknown.
//!
//! ```text
//! #[derive(redguard::Classify)]
//! #[classify(indeterminate)]          // optional: the default for unmarked variants
//! enum OrderError {
//!     #[classify(business)] OutOfStock,
//!     #[classify(indeterminate)] GatewayTimeout,
//!     #[classify(from)]               // also: `impl From<redguard::Error>` building it
//!     Guard(redguard::Error),         // one `redguard::Error` field: classifies itself
//!     #[classify(delegate)] Db(DbError), // one field whose type implements `Classify`
//! }
//! ```
//!
//! Why a derive: the hand-written `impl Classify for E {}` calls every error a business error,
//! including a wrapped guard refusal that left the outcome unknown (a lock lost mid-body), so a
//! retry would run the body again. The derive sees the wrapped `redguard::Error` itself.
//! `from` is opt-in: a derived `From` would conflict with one written by hand or by
//! `thiserror`'s `#[from]`.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, Type};

use crate::errors::Errors;

/// How one variant (or the struct) classifies.
#[derive(Clone, Copy)]
enum Rule {
    Business,
    Indeterminate,
    /// The single field's own `Classify`.
    Delegate,
}

/// Input: a `DeriveInput` of an enum or struct. Output: `impl ::redguard::Classify`.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(err) => return err.to_compile_error(),
    };
    let mut errors = Errors::new();
    let (own, own_from) = rule_of(&input.attrs, &mut errors);
    // The one place `#[classify(from)]` builds from a `redguard::Error`: `Self::Variant` or
    // `Self`, with its fields.
    let mut from: Option<(TokenStream, &Fields, Span)> = None;
    let default = match own {
        Some(Rule::Delegate) if !matches!(input.data, Data::Struct(_)) => {
            errors.push(
                input.ident.span(),
                "`#[classify(delegate)]` on an enum: put it on the variants that hold the \
                 error to delegate to",
            );
            Rule::Business
        }
        own => own.unwrap_or(Rule::Business),
    };
    if let (Some(at), Data::Enum(_)) = (own_from, &input.data) {
        errors.push(
            at,
            "`#[classify(from)]` on an enum: put it on the variant that holds the \
             `redguard::Error`",
        );
    }
    let arms = match &input.data {
        Data::Enum(data) => data
            .variants
            .iter()
            .map(|variant| {
                let (mut rule, variant_from) = rule_of(&variant.attrs, &mut errors);
                let name = &variant.ident;
                if let Some(at) = variant_from {
                    if from.is_some() {
                        errors.push(at, "only one variant can be `#[classify(from)]`");
                    }
                    from = Some((quote!(Self::#name), &variant.fields, at));
                    if single_field(&variant.fields).is_some() {
                        rule = rule.or(Some(Rule::Delegate));
                    }
                }
                arm(
                    quote!(Self::#name),
                    name.span(),
                    &variant.fields,
                    rule,
                    default,
                    &mut errors,
                )
            })
            .collect(),
        // The type-level attribute is the struct's own rule.
        Data::Struct(data) => {
            let at = input.ident.span();
            let mut own = own;
            if let Some(at) = own_from {
                from = Some((quote!(Self), &data.fields, at));
                if single_field(&data.fields).is_some() {
                    own = own.or(Some(Rule::Delegate));
                }
            }
            vec![arm(
                quote!(Self),
                at,
                &data.fields,
                own,
                default,
                &mut errors,
            )]
        }
        Data::Union(data) => {
            errors.push(
                data.union_token.span,
                "`#[derive(Classify)]` applies to enums and structs, not unions",
            );
            Vec::new()
        }
    };
    let from = from.map(|(path, fields, at)| from_impl(&path, fields, at, &input, &mut errors));
    if let Err(err) = errors.finish() {
        return err.to_compile_error();
    }
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let body = if arms.is_empty() {
        // An enum without variants has no value to classify.
        quote!(match *self {})
    } else {
        quote!(match self { #(#arms)* })
    };
    quote! {
        impl #impl_generics ::redguard::Classify for #name #ty_generics #where_clause {
            fn class(&self) -> ::redguard::ErrorClass {
                #body
            }
        }
        #from
    }
}

/// `impl From<redguard::Error>` for `#[classify(from)]` (written at `at`): `path` with its one
/// field set to the error.
fn from_impl(
    path: &TokenStream,
    fields: &Fields,
    at: Span,
    input: &DeriveInput,
    errors: &mut Errors,
) -> TokenStream {
    let build = match (fields, single_field(fields)) {
        (Fields::Named(_), Some(field)) => {
            let name = &field.ident;
            quote!(#path { #name: err })
        }
        (Fields::Unnamed(_), Some(_)) => quote!(#path(err)),
        _ => {
            errors.push(
                at,
                "`#[classify(from)]` needs exactly one field, of type `redguard::Error`",
            );
            return TokenStream::new();
        }
    };
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        impl #impl_generics ::core::convert::From<::redguard::Error> for #name #ty_generics
            #where_clause
        {
            fn from(err: ::redguard::Error) -> Self {
                #build
            }
        }
    }
}

/// One match arm: `<path> { .. } => class,` or `<path>(inner) => inner.class(),`. `at` is
/// where a problem with it is reported.
fn arm(
    path: TokenStream,
    at: Span,
    fields: &Fields,
    rule: Option<Rule>,
    default: Rule,
    errors: &mut Errors,
) -> TokenStream {
    let only = single_field(fields);
    let rule = match (rule, only) {
        (Some(rule), _) => rule,
        // A guard refusal wrapped in the user's error classifies itself.
        (None, Some(field)) if is_guard_error(&field.ty) => Rule::Delegate,
        (None, _) => default,
    };
    let class = |class: &str| {
        let class = Ident::new(class, Span::call_site());
        quote!(#path { .. } => ::redguard::ErrorClass::#class,)
    };
    match rule {
        Rule::Business => class("Business"),
        Rule::Indeterminate => class("Indeterminate"),
        Rule::Delegate => match (fields, only) {
            (Fields::Named(_), Some(field)) => {
                let name = &field.ident;
                quote!(#path { #name: inner } => ::redguard::Classify::class(inner),)
            }
            (Fields::Unnamed(_), Some(_)) => {
                quote!(#path(inner) => ::redguard::Classify::class(inner),)
            }
            _ => {
                errors.push(
                    at,
                    "`#[classify(delegate)]` needs exactly one field, whose type implements \
                     `redguard::Classify`",
                );
                quote!()
            }
        },
    }
}

fn single_field(fields: &Fields) -> Option<&syn::Field> {
    let mut iter = fields.iter();
    match (iter.next(), iter.next()) {
        (Some(field), None) => Some(field),
        _ => None,
    }
}

/// `redguard::Error` or `::redguard::Error`, as users write the wrapped guard error.
fn is_guard_error(ty: &Type) -> bool {
    let Type::Path(path) = ty else {
        return false;
    };
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    path.qself.is_none() && segments == ["redguard", "Error"]
}

/// The `#[classify(..)]` rule among `attrs`, if any, and where `from` was written.
fn rule_of(attrs: &[Attribute], errors: &mut Errors) -> (Option<Rule>, Option<Span>) {
    let mut rule = None;
    let mut from = None;
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("classify")) {
        let parsed = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("from") {
                from = Some(syn::spanned::Spanned::span(&meta.path));
                return Ok(());
            }
            let found = if meta.path.is_ident("business") {
                Rule::Business
            } else if meta.path.is_ident("indeterminate") {
                Rule::Indeterminate
            } else if meta.path.is_ident("delegate") {
                Rule::Delegate
            } else {
                return Err(meta.error(
                    "unknown `classify` argument; expected `business`, `indeterminate`, \
                     `delegate` or `from`",
                ));
            };
            if rule.replace(found).is_some() {
                return Err(meta.error("only one `classify` rule per item"));
            }
            Ok(())
        });
        if let Err(err) = parsed {
            errors.push_error(err);
        }
    }
    (rule, from)
}
