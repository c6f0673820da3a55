//! Parsing attribute arguments into typed, spanned values.
//!
//! Syntax: `name = value, flag, ...`. Each attribute declares its arguments in a table of
//! [`ArgSpec`]s; one mechanism reports unknown names (listing the valid ones), duplicates (at
//! the second occurrence) and values of the wrong shape, all accumulated.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::{Expr, ExprLit, Ident, Lit, LitInt, LitStr, Meta, Token};

use crate::errors::Errors;
use crate::template::{self, Segment};

/// The shape an argument's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A key template string.
    Template,
    /// A duration string, or an integer of seconds.
    Duration,
    /// Any expression, evaluated per call.
    Expr,
    /// A string literal.
    Str,
    /// An integer literal.
    Int,
    /// A bare name with no value.
    Flag,
}

/// One argument an attribute accepts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArgSpec {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
}

/// A parsed key template with the literal it came from (for spans).
pub(crate) struct TemplateArg {
    pub(crate) lit: LitStr,
    pub(crate) segments: Vec<Segment>,
}

impl TemplateArg {
    /// The span of `range` within the literal's contents, or the literal's span where the
    /// compiler cannot point inside it.
    pub(crate) fn span_of(&self, range: std::ops::Range<usize>) -> Span {
        let quote = self.lit.token().to_string().find('"').map_or(0, |i| i + 1);
        self.lit
            .token()
            .subspan(range.start + quote..range.end + quote)
            .unwrap_or_else(|| self.lit.span())
    }
}

/// A value with the span of what the user wrote.
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// A parsed argument value.
pub(crate) enum Value {
    Template(TemplateArg),
    Duration(Spanned<Duration>),
    Expr(Expr),
    Str(LitStr),
    Int(Spanned<u64>),
    Flag(Span),
}

/// The arguments of one attribute, in the order written.
pub(crate) struct Args {
    values: Vec<(Ident, Value)>,
    written: Vec<Ident>,
}

impl Args {
    /// Whether the user wrote `name`, valid or not (so a bad value is not also "missing").
    pub(crate) fn written(&self, name: &str) -> bool {
        self.written.iter().any(|ident| ident == name)
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(ident, _)| ident == name)
            .map(|(_, value)| value)
    }

    pub(crate) fn template(&self, name: &str) -> Option<&TemplateArg> {
        match self.get(name)? {
            Value::Template(value) => Some(value),
            _ => None,
        }
    }

    pub(crate) fn duration(&self, name: &str) -> Option<&Spanned<Duration>> {
        match self.get(name)? {
            Value::Duration(value) => Some(value),
            _ => None,
        }
    }

    pub(crate) fn expr(&self, name: &str) -> Option<&Expr> {
        match self.get(name)? {
            Value::Expr(value) => Some(value),
            _ => None,
        }
    }

    pub(crate) fn str(&self, name: &str) -> Option<&LitStr> {
        match self.get(name)? {
            Value::Str(value) => Some(value),
            _ => None,
        }
    }

    pub(crate) fn int(&self, name: &str) -> Option<&Spanned<u64>> {
        match self.get(name)? {
            Value::Int(value) => Some(value),
            _ => None,
        }
    }

    pub(crate) fn flag(&self, name: &str) -> Option<Span> {
        match self.get(name)? {
            Value::Flag(span) => Some(*span),
            _ => None,
        }
    }

    pub(crate) fn templates(&self) -> impl Iterator<Item = &TemplateArg> {
        self.values.iter().filter_map(|(_, value)| match value {
            Value::Template(template) => Some(template),
            _ => None,
        })
    }
}

/// Parses `tokens` against `specs`. Syntax errors end parsing; everything else is pushed to
/// `errors` and parsing goes on.
pub(crate) fn parse(
    attr: &str,
    specs: &[ArgSpec],
    tokens: TokenStream,
    errors: &mut Errors,
) -> syn::Result<Args> {
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens)?;
    let mut values: Vec<(Ident, Value)> = Vec::new();
    let mut written: Vec<Ident> = Vec::new();
    for meta in metas {
        let Some(ident) = meta.path().get_ident().cloned() else {
            errors.push(
                meta.path().span(),
                format!("expected an argument name of `#[{attr}]`"),
            );
            continue;
        };
        let Some(spec) = specs.iter().find(|spec| ident == spec.name) else {
            let names: Vec<String> = specs.iter().map(|s| format!("`{}`", s.name)).collect();
            errors.push(
                ident.span(),
                format!(
                    "unknown argument `{ident}` of `#[{attr}]`; expected one of {}",
                    names.join(", ")
                ),
            );
            continue;
        };
        if written.contains(&ident) {
            errors.push(
                ident.span(),
                format!("duplicate argument `{ident}` of `#[{attr}]`"),
            );
            continue;
        }
        written.push(ident.clone());
        if let Some(value) = parse_value(attr, spec, meta, errors) {
            values.push((ident, value));
        }
    }
    Ok(Args { values, written })
}

fn parse_value(attr: &str, spec: &ArgSpec, meta: Meta, errors: &mut Errors) -> Option<Value> {
    let name = spec.name;
    let expr = match (meta, spec.kind) {
        (Meta::Path(path), Kind::Flag) => return Some(Value::Flag(path.span())),
        (meta, Kind::Flag) => {
            errors.push(
                meta.span(),
                format!("`{name}` of `#[{attr}]` takes no value"),
            );
            return None;
        }
        (Meta::NameValue(nv), _) => nv.value,
        (meta, _) => {
            errors.push(
                meta.span(),
                format!("expected `{name} = ...` in `#[{attr}]`"),
            );
            return None;
        }
    };
    let lit = match &expr {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit.clone()),
        _ => None,
    };
    let value = match (spec.kind, lit) {
        (Kind::Expr, _) => Value::Expr(expr),
        (Kind::Template, Some(Lit::Str(lit))) => template_arg(lit, errors)?,
        (Kind::Duration, Some(Lit::Str(lit))) => {
            match redguard_grammar::duration::parse(&lit.value()) {
                Ok(value) => Value::Duration(Spanned {
                    value,
                    span: lit.span(),
                }),
                Err(message) => {
                    errors.push(lit.span(), format!("invalid `{name}`: {message}"));
                    return None;
                }
            }
        }
        (Kind::Duration, Some(Lit::Int(lit))) => {
            let secs = int(&lit, name, errors)?;
            Value::Duration(Spanned {
                value: Duration::from_secs(secs),
                span: lit.span(),
            })
        }
        (Kind::Str, Some(Lit::Str(lit))) => Value::Str(lit),
        (Kind::Int, Some(Lit::Int(lit))) => Value::Int(Spanned {
            value: int(&lit, name, errors)?,
            span: lit.span(),
        }),
        (kind, _) => {
            let expected = match kind {
                Kind::Template => "a key template string, e.g. \"order:{id}\"",
                Kind::Duration => "a duration such as \"300ms\" or an integer of seconds",
                Kind::Str => "a string literal",
                Kind::Int => "an integer literal",
                Kind::Expr | Kind::Flag => unreachable!("handled above"),
            };
            errors.push(
                expr.span(),
                format!("`{name}` of `#[{attr}]` expects {expected}"),
            );
            return None;
        }
    };
    Some(value)
}

fn int(lit: &LitInt, name: &str, errors: &mut Errors) -> Option<u64> {
    match lit.base10_parse::<u64>() {
        Ok(n) => Some(n),
        Err(_) => {
            errors.push(
                lit.span(),
                format!("`{name}` must be a non-negative integer"),
            );
            None
        }
    }
}

fn template_arg(lit: LitStr, errors: &mut Errors) -> Option<Value> {
    match template::parse(&lit.value()) {
        Ok(segments) => Some(Value::Template(TemplateArg { lit, segments })),
        Err(problems) => {
            let arg = TemplateArg {
                lit,
                segments: Vec::new(),
            };
            for problem in problems {
                errors.push(arg.span_of(problem.range), problem.message);
            }
            None
        }
    }
}
