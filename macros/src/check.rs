//! Cross-checks between an attribute's arguments and the fn it is on.

use std::time::Duration;

use syn::{FnArg, LitStr, Pat, Signature};

use crate::args::{Spanned, TemplateArg};
use crate::errors::Errors;
use crate::template::Segment;

/// Why: every guard wraps the body in a future, so only `async fn` can be guarded.
pub(crate) fn is_async(attr: &str, sig: &Signature, errors: &mut Errors) {
    if sig.asyncness.is_none() {
        errors.push(
            sig.fn_token.span,
            format!("`#[{attr}]` can only be used on an `async fn`"),
        );
    }
}

/// The names a placeholder root may refer to: the fn's parameters bound by plain identifiers.
fn parameter_names(sig: &Signature) -> Vec<String> {
    sig.inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(_) => Some("self".to_owned()),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) => Some(ident.ident.to_string()),
                _ => None,
            },
        })
        .collect()
}

/// Why: a placeholder that names no parameter would otherwise resolve to whatever is in scope
/// (a constant, a static), silently giving every call the same key.
pub(crate) fn placeholders(
    attr: &str,
    templates: &[&TemplateArg],
    sig: &Signature,
    errors: &mut Errors,
) {
    let params = parameter_names(sig);
    for template in templates {
        check_template(attr, template, &params, errors);
    }
}

fn check_template(attr: &str, template: &TemplateArg, params: &[String], errors: &mut Errors) {
    for segment in &template.segments {
        let Segment::Placeholder { root, range, .. } = segment else {
            continue;
        };
        if !params.iter().any(|param| param == root) {
            let listed = if params.is_empty() {
                "the fn has no parameters".to_owned()
            } else {
                format!("parameters: {}", params.join(", "))
            };
            errors.push(
                template.span_of(range.clone()),
                format!(
                    "placeholder `{{{root}}}` in `#[{attr}]` names no parameter of this fn \
                     ({listed})"
                ),
            );
        }
    }
}

/// Why: a guard's refusal (in progress, rate limited, lock timeout) is returned as the fn's
/// error, so the fn must return `Result<T, E>` with `E: From<redguard::Error>`. The trait
/// bound is checked by the expansion at the return type; a missing return type is caught here.
pub(crate) fn return_type(attr: &str, sig: &Signature, errors: &mut Errors) -> Option<syn::Type> {
    let ret = match &sig.output {
        syn::ReturnType::Type(_, ty) => Some((**ty).clone()),
        syn::ReturnType::Default => None,
    };
    match &ret {
        None => errors.push(
            sig.ident.span(),
            format!(
                "`#[{attr}]` needs the fn to return `Result<T, E>` where \
                 `E: From<redguard::Error>`, so a refusal can be returned"
            ),
        ),
        // Why here and not by the expansion's trait bounds: a type that is certainly no
        // `Result` fails every wrapper's bounds at once (six errors, one about `Serialize`).
        Some(ty) if !may_be_result(ty) => errors.push_error(syn::Error::new_spanned(
            ty,
            format!(
                "`#[{attr}]` needs the fn to return `Result<T, E>` where \
                 `E: From<redguard::Error>`, so a refusal can be returned, not `{}`: \
                 e.g. `redguard::Result<{}>`",
                shown(ty),
                shown(ty),
            ),
        )),
        Some(_) => {}
    }
    ret
}

/// Whether `ty` may be a `Result`: `false` only for types that certainly are not (tuples,
/// references, `impl Trait`, primitives, `String`, `Option<T>`, ..). A path is otherwise
/// given the benefit of the doubt, as it may be an alias (`anyhow::Result<T>`,
/// `io::Result<T>`, the user's own `type ApiResult<T> = ..`): the expansion's trait bounds
/// check it.
fn may_be_result(ty: &syn::Type) -> bool {
    const NOT_RESULT: &[&str] = &[
        "bool", "char", "str", "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32",
        "i64", "i128", "isize", "f32", "f64", "String", "Vec", "Option", "Box", "Arc", "Rc", "Cow",
        "HashMap", "HashSet", "BTreeMap", "BTreeSet", "VecDeque", "Duration",
    ];
    match ty {
        syn::Type::Paren(inner) => may_be_result(&inner.elem),
        syn::Type::Group(inner) => may_be_result(&inner.elem),
        syn::Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .is_none_or(|last| !NOT_RESULT.iter().any(|name| last.ident == name)),
        syn::Type::Path(_) | syn::Type::Macro(_) | syn::Type::Verbatim(_) => true,
        _ => false,
    }
}

/// Why: a scope or scene ends up inside keys; checking it here turns a runtime
/// `InvalidKey` on every call into one compile error.
pub(crate) fn name(what: &str, lit: &LitStr, errors: &mut Errors) {
    let value = lit.value();
    let valid = !value.is_empty()
        && value.len() <= 200
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-' | b':'));
    if !valid {
        errors.push(
            lit.span(),
            format!(
                "`{what}` must be 1 to 200 characters from letters, digits and `.` `_` `@` `-` `:`"
            ),
        );
    }
}

/// `replicas = n` and `replicas_timeout = ".."`, checked with the runtime's own bounds; the
/// pair to expand into `.replicas(n, timeout)` when `replicas` is given and valid.
///
/// Why `replicas_timeout` alone is an error: it would silently do nothing.
pub(crate) fn replicas(
    attr: &str,
    count: Option<&Spanned<u64>>,
    timeout: Option<&Spanned<Duration>>,
    errors: &mut Errors,
) -> Option<(u32, Duration)> {
    if let Some(timeout) = timeout
        && let Err(why) = redguard_grammar::replicas::timeout(timeout.value)
    {
        errors.push(
            timeout.span,
            format!("invalid `replicas_timeout` of `#[{attr}]`: {why}"),
        );
    }
    let Some(count) = count else {
        if let Some(timeout) = timeout {
            errors.push(
                timeout.span,
                format!(
                    "`replicas_timeout` of `#[{attr}]` needs `replicas = n`: how many replicas \
                     must confirm each write"
                ),
            );
        }
        return None;
    };
    match redguard_grammar::replicas::count(count.value) {
        Ok(count) => Some((
            count,
            timeout.map_or(redguard_grammar::replicas::DEFAULT_TIMEOUT, |t| t.value),
        )),
        Err(why) => {
            errors.push(
                count.span,
                format!("invalid `replicas` of `#[{attr}]`: {why}"),
            );
            None
        }
    }
}

/// A type as the user wrote it, near enough: `Vec<u8>`, not `Vec < u8 >`.
pub(crate) fn shown(tokens: &impl quote::ToTokens) -> String {
    let mut text = tokens.to_token_stream().to_string();
    for (from, to) in [
        (" <", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" ,", ","),
        ("& ", "&"),
        (" :: ", "::"),
    ] {
        text = text.replace(from, to);
    }
    text
}

/// Why: `detach` moves the body into a task of its own (`'static`), so a borrowed parameter
/// fails deep in the expansion with "borrowed data escapes" (E0521); one error at the
/// parameter says what to change.
pub(crate) fn owned_parameters(attr: &str, flag: &str, sig: &Signature, errors: &mut Errors) {
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) if receiver.reference.is_some() || borrows(&receiver.ty) => {
                errors.push_error(syn::Error::new_spanned(
                    receiver,
                    format!(
                        "`{flag}` of `#[{attr}]` runs the body in its own task, so it cannot \
                         borrow `self`: take `self` by value (e.g. an `Arc<Self>` or a clone of \
                         what the body needs)"
                    ),
                ));
            }
            FnArg::Typed(typed) if borrows(&typed.ty) => {
                errors.push_error(syn::Error::new_spanned(
                    &typed.ty,
                    format!(
                        "`{flag}` of `#[{attr}]` runs the body in its own task, so it cannot \
                         borrow `{}`: take it by value (e.g. `String` instead of `&str`)",
                        shown(&typed.pat)
                    ),
                ));
            }
            _ => {}
        }
    }
}

/// Whether `ty` holds a borrow: a reference or a lifetime other than `'static` (a
/// higher-ranked one, as in `Box<dyn Fn(&str)>`, borrows nothing).
fn borrows(ty: &syn::Type) -> bool {
    let lifetime = |lt: &syn::Lifetime| lt.ident != "static";
    let bounds = |bounds: &syn::punctuated::Punctuated<syn::TypeParamBound, syn::Token![+]>| {
        bounds.iter().any(|bound| match bound {
            syn::TypeParamBound::Lifetime(lt) => lifetime(lt),
            syn::TypeParamBound::Trait(bound) => path_borrows(&bound.path),
            _ => false,
        })
    };
    match ty {
        syn::Type::Reference(reference) => {
            reference.lifetime.as_ref().is_none_or(lifetime) || borrows(&reference.elem)
        }
        syn::Type::Path(path) => {
            path.qself.as_ref().is_some_and(|q| borrows(&q.ty)) || path_borrows(&path.path)
        }
        syn::Type::Tuple(tuple) => tuple.elems.iter().any(borrows),
        syn::Type::Array(array) => borrows(&array.elem),
        syn::Type::Slice(slice) => borrows(&slice.elem),
        syn::Type::Paren(inner) => borrows(&inner.elem),
        syn::Type::Group(inner) => borrows(&inner.elem),
        syn::Type::TraitObject(object) => bounds(&object.bounds),
        syn::Type::ImplTrait(object) => bounds(&object.bounds),
        _ => false,
    }
}

fn path_borrows(path: &syn::Path) -> bool {
    path.segments
        .iter()
        .any(|segment| match &segment.arguments {
            syn::PathArguments::AngleBracketed(args) => args.args.iter().any(|arg| match arg {
                syn::GenericArgument::Lifetime(lt) => lt.ident != "static",
                syn::GenericArgument::Type(ty) => borrows(ty),
                _ => false,
            }),
            _ => false,
        })
}
