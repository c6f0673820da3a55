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
use syn::{Expr, ExprLit, Lit, LitInt, LitStr, Meta, Token};

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
#[derive(Clone)]
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

/// An attribute's arguments as a struct of typed values: declared with [`arguments!`], filled
/// by [`parse`].
pub(crate) trait Arguments: Default {
    /// The attribute's name, for messages.
    const ATTR: &'static str;
    /// The arguments it accepts.
    const SPECS: &'static [ArgSpec];
    /// Stores a parsed value of the argument `name` (of the shape its spec gives).
    fn set(&mut self, name: &str, value: Value);
    /// Remembers that `name` was written, valid or not.
    fn mark_written(&mut self, name: &'static str);
    /// Whether the user wrote `name`, valid or not (so a bad value is not also "missing").
    fn written(&self, name: &str) -> bool;
    /// Every key template among the arguments.
    fn templates(&self) -> Vec<&TemplateArg>;
    /// `crate = "path"`: where a re-exporting crate put the runtime (every attribute takes it).
    fn krate(&self) -> Option<&LitStr>;
}

/// The Rust type of an argument's value, by [`Kind`].
macro_rules! arg_type {
    (Template) => { $crate::args::TemplateArg };
    (Duration) => { $crate::args::Spanned<::std::time::Duration> };
    (Expr) => { ::syn::Expr };
    (Str) => { ::syn::LitStr };
    (Int) => { $crate::args::Spanned<u64> };
    (Flag) => { ::proc_macro2::Span };
}
pub(crate) use arg_type;

/// Declares an attribute's arguments: a struct with one optional field per argument, and the
/// table [`parse`] checks names and shapes against. Every attribute also takes
/// `crate = "path"` (the `krate` field).
macro_rules! arguments {
    (
        $(#[$doc:meta])*
        $name:ident for $attr:literal {
            $($field:ident : $kind:ident),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Default)]
        pub(crate) struct $name {
            $(pub(crate) $field: Option<$crate::args::arg_type!($kind)>,)*
            krate: Option<::syn::LitStr>,
            written: Vec<&'static str>,
        }

        impl $crate::args::Arguments for $name {
            const ATTR: &'static str = $attr;
            const SPECS: &'static [$crate::args::ArgSpec] = &[
                $(
                    $crate::args::ArgSpec {
                        name: stringify!($field),
                        kind: $crate::args::Kind::$kind,
                    },
                )*
                $crate::args::ArgSpec {
                    name: "crate",
                    kind: $crate::args::Kind::Str,
                },
            ];

            fn set(&mut self, name: &str, value: $crate::args::Value) {
                $(
                    if name == stringify!($field)
                        && let $crate::args::Value::$kind(value) = value
                    {
                        self.$field = Some(value);
                        return;
                    }
                )*
                if name == "crate"
                    && let $crate::args::Value::Str(value) = value
                {
                    self.krate = Some(value);
                }
            }

            fn krate(&self) -> Option<&::syn::LitStr> {
                self.krate.as_ref()
            }

            fn mark_written(&mut self, name: &'static str) {
                self.written.push(name);
            }

            fn written(&self, name: &str) -> bool {
                self.written.contains(&name)
            }

            fn templates(&self) -> Vec<&$crate::args::TemplateArg> {
                let mut templates = Vec::new();
                $(
                    if let Some(template) = self.$field.as_ref().and_then($crate::args::AsTemplate::as_template) {
                        templates.push(template);
                    }
                )*
                templates
            }
        }
    };
}
pub(crate) use arguments;

/// The template inside an argument value, if it is one.
pub(crate) trait AsTemplate {
    fn as_template(&self) -> Option<&TemplateArg> {
        None
    }
}

impl AsTemplate for TemplateArg {
    fn as_template(&self) -> Option<&TemplateArg> {
        Some(self)
    }
}
impl AsTemplate for Spanned<Duration> {}
impl AsTemplate for Spanned<u64> {}
impl AsTemplate for Expr {}
impl AsTemplate for LitStr {}
impl AsTemplate for Span {}

/// Parses `tokens` into `A`. Syntax errors end parsing; everything else is pushed to `errors`
/// and parsing goes on.
pub(crate) fn parse<A: Arguments>(tokens: TokenStream, errors: &mut Errors) -> syn::Result<A> {
    let (attr, specs) = (A::ATTR, A::SPECS);
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens)?;
    let mut args = A::default();
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
            let guess = closest(&ident.to_string(), specs)
                .map(|name| format!("did you mean `{name}`? "))
                .unwrap_or_default();
            errors.push(
                ident.span(),
                format!(
                    "unknown argument `{ident}` of `#[{attr}]`; {guess}expected one of {}",
                    names.join(", ")
                ),
            );
            continue;
        };
        if args.written(spec.name) {
            errors.push(
                ident.span(),
                format!("duplicate argument `{ident}` of `#[{attr}]`"),
            );
            continue;
        }
        args.mark_written(spec.name);
        if let Some(value) = parse_value(attr, spec, meta, errors) {
            args.set(spec.name, value);
        }
    }
    Ok(args)
}

/// The accepted name closest to a misspelt one, if close enough to be what was meant (at most
/// two edits, and fewer than half its letters).
fn closest(written: &str, specs: &[ArgSpec]) -> Option<&'static str> {
    specs
        .iter()
        .map(|spec| (edit_distance(written, spec.name), spec.name))
        .filter(|(distance, name)| *distance <= 2 && *distance * 2 < name.len())
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Levenshtein distance, with a swap of two neighbours counted as one edit (`brust`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![(0..=b.len()).collect::<Vec<usize>>()];
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let substitute = rows[i - 1][j - 1] + usize::from(a[i - 1] != b[j - 1]);
            row[j] = substitute.min(rows[i - 1][j] + 1).min(row[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(rows[i - 2][j - 2] + 1);
            }
        }
        rows.push(row);
    }
    rows[a.len()][b.len()]
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
