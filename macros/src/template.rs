//! The key-template language, parsed without any proc-macro types so it can be unit-tested.
//!
//! `"stock:{sku}"`, `"{user_id}:{req.request_id}"`: literal text from `[A-Za-z0-9._@:-]` and
//! placeholders `{root.field.field}` where `root` names a parameter. Two placeholders must be
//! separated by text containing `:`, the one character a rendered value can never contain, so
//! two different argument lists never render the same key.

use std::ops::Range;

/// One piece of a template, with its byte range inside the string's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Text {
        text: String,
        range: Range<usize>,
    },
    Placeholder {
        root: String,
        fields: Vec<String>,
        range: Range<usize>,
    },
}

/// A problem found at `range` of the template's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) range: Range<usize>,
    pub(crate) message: String,
}

fn error(range: Range<usize>, message: impl Into<String>) -> TemplateError {
    TemplateError {
        range,
        message: message.into(),
    }
}

fn is_text_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-' | ':')
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s != "_"
}

fn is_field(s: &str) -> bool {
    is_ident(s) || (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
}

/// Parses `source`, reporting every problem rather than the first.
pub(crate) fn parse(source: &str) -> Result<Vec<Segment>, Vec<TemplateError>> {
    let mut segments = Vec::new();
    let mut errors = Vec::new();
    if source.is_empty() {
        errors.push(error(
            0..0,
            "the key template is empty; write e.g. \"order:{id}\"",
        ));
        return Err(errors);
    }
    let mut text_start = 0;
    let mut rest = source.char_indices().peekable();
    while let Some((at, c)) = rest.next() {
        match c {
            '{' => {
                push_text(source, text_start..at, &mut segments, &mut errors);
                let close = source[at + 1..].find(['{', '}']).map(|i| at + 1 + i);
                match close {
                    Some(end) if source.as_bytes()[end] == b'}' => {
                        segments.push(placeholder(source, at..end + 1, &mut errors));
                        while rest.peek().is_some_and(|(i, _)| *i <= end) {
                            rest.next();
                        }
                        text_start = end + 1;
                    }
                    _ => {
                        errors.push(error(
                            at..at + 1,
                            "unclosed `{` in key template; close the placeholder with `}`",
                        ));
                        text_start = source.len();
                        break;
                    }
                }
            }
            '}' => {
                push_text(source, text_start..at, &mut segments, &mut errors);
                errors.push(error(
                    at..at + 1,
                    "unmatched `}` in key template; placeholders look like `{name}`",
                ));
                text_start = at + 1;
            }
            _ => {}
        }
    }
    push_text(source, text_start..source.len(), &mut segments, &mut errors);
    check_separators(&segments, &mut errors);
    if errors.is_empty() {
        Ok(segments)
    } else {
        Err(errors)
    }
}

fn push_text(
    source: &str,
    range: Range<usize>,
    segments: &mut Vec<Segment>,
    errors: &mut Vec<TemplateError>,
) {
    if range.is_empty() {
        return;
    }
    let text = &source[range.clone()];
    if let Some((i, bad)) = text.char_indices().find(|(_, c)| !is_text_char(*c)) {
        let at = range.start + i;
        errors.push(error(
            at..at + bad.len_utf8(),
            format!(
                "{bad:?} is not allowed in key template text; use letters, digits and `.` `_` `@` `-` `:`"
            ),
        ));
    }
    segments.push(Segment::Text {
        text: text.to_owned(),
        range,
    });
}

fn placeholder(source: &str, range: Range<usize>, errors: &mut Vec<TemplateError>) -> Segment {
    let inner = &source[range.start + 1..range.end - 1];
    let mut path = inner.split('.');
    let root = path.next().unwrap_or_default().trim().to_owned();
    let fields: Vec<String> = path.map(|f| f.trim().to_owned()).collect();
    if inner.trim().is_empty() {
        errors.push(error(
            range.clone(),
            "empty placeholder `{}`; name a parameter, e.g. `{user_id}`",
        ));
    } else if !is_ident(&root) || !fields.iter().all(|f| is_field(f)) || inner.contains(' ') {
        errors.push(error(
            range.clone(),
            format!(
                "`{{{inner}}}` is not a placeholder; write a parameter name followed by \
                 `.field` accesses, e.g. `{{req.user_id}}`"
            ),
        ));
    }
    Segment::Placeholder {
        root,
        fields,
        range,
    }
}

/// Two placeholders need a `:` between them, or `{a}{b}` with ("1", "23") and ("12", "3")
/// would address the same record.
fn check_separators(segments: &[Segment], errors: &mut Vec<TemplateError>) {
    let mut previous_placeholder = false;
    let mut separated = true;
    for segment in segments {
        match segment {
            Segment::Text { text, .. } => separated |= text.contains(':'),
            Segment::Placeholder { range, .. } => {
                if previous_placeholder && !separated {
                    errors.push(error(
                        range.clone(),
                        "placeholders must be separated by text containing `:` (e.g. \
                         `{a}:{b}`), otherwise different values can render the same key",
                    ));
                }
                previous_placeholder = true;
                separated = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholders(source: &str) -> Vec<(String, Vec<String>)> {
        parse(source)
            .unwrap()
            .into_iter()
            .filter_map(|s| match s {
                Segment::Placeholder { root, fields, .. } => Some((root, fields)),
                Segment::Text { .. } => None,
            })
            .collect()
    }

    fn first_error(source: &str) -> TemplateError {
        parse(source).unwrap_err().remove(0)
    }

    #[test]
    fn parses_text_and_placeholders() {
        let segments = parse("stock:{sku}").unwrap();
        assert_eq!(
            segments,
            vec![
                Segment::Text {
                    text: "stock:".into(),
                    range: 0..6
                },
                Segment::Placeholder {
                    root: "sku".into(),
                    fields: vec![],
                    range: 6..11
                },
            ]
        );
        assert_eq!(
            placeholders("{user_id}:{req.request_id}"),
            vec![
                ("user_id".into(), vec![]),
                ("req".into(), vec!["request_id".into()])
            ]
        );
        assert_eq!(
            placeholders("{a.0.b}"),
            vec![("a".into(), vec!["0".into(), "b".into()])]
        );
        assert!(placeholders("order:submit").is_empty());
    }

    #[test]
    fn rejects_malformed_templates() {
        assert_eq!(first_error("").range, 0..0);
        assert!(first_error("a:{b").message.contains("unclosed"));
        assert!(first_error("a:b}").message.contains("unmatched"));
        assert!(first_error("a:{}").message.contains("empty placeholder"));
        assert!(first_error("a:{ }").message.contains("empty placeholder"));
        assert!(first_error("{a{b}}").message.contains("unclosed"));
        assert!(first_error("{1a}").message.contains("not a placeholder"));
        assert!(first_error("{a.}").message.contains("not a placeholder"));
        assert!(first_error("{a-b}").message.contains("not a placeholder"));
        assert_eq!(first_error("a b:{x}").range, 1..2);
        assert!(first_error("{a}{b}").message.contains("separated"));
        assert!(first_error("{a}-{b}").message.contains("separated"));
        assert!(parse("{a}:{b}").is_ok());
    }

    #[test]
    fn reports_every_error() {
        assert_eq!(parse("a b:{}:}").unwrap_err().len(), 3);
    }
}
