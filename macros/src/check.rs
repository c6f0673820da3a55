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
    if ret.is_none() {
        errors.push(
            sig.ident.span(),
            format!(
                "`#[{attr}]` needs the fn to return `Result<T, E>` where \
                 `E: From<redguard::Error>`, so a refusal can be returned"
            ),
        );
    }
    ret
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
