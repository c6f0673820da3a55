//! Store keys: rendering values into them and the rules that keep hostile input out.
//!
//! A full key is `<prefix>:<guard>:{<scope>:<rendered template>}`. The braces are a Redis
//! Cluster hash tag, so every key one guard operation touches lands in one slot. Values
//! rendered into a key come from requests, so each part is checked before anything reaches the
//! store: at most [`MAX_PART_LEN`] bytes from `[A-Za-z0-9._@-]`, and the whole key at most
//! [`MAX_KEY_LEN`] bytes. `:` is excluded from parts on purpose: templates separate placeholders
//! with it, so two different sets of values can never render the same key.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest rendered value of one placeholder, in bytes.
pub const MAX_PART_LEN: usize = 64;
/// Longest full key, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// Longest scope, in bytes.
pub const MAX_SCOPE_LEN: usize = 200;

/// A value that can be rendered into a guard key.
///
/// Implemented for integers, `bool`, `str`, `String`, [`uuid::Uuid`], and for references,
/// smart pointers and `Option`s of those (`None` renders empty and is reported as
/// [`Error::MissingKey`]). Implement it for your own id types by writing their canonical text.
///
/// ```
/// use redguard::key::KeyPart;
///
/// struct Sku(String);
///
/// impl KeyPart for Sku {
///     fn write_key_part(&self, out: &mut String) {
///         out.push_str(&self.0);
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be rendered into a redguard key",
    label = "this placeholder's value does not implement `redguard::key::KeyPart`",
    note = "`KeyPart` is implemented for integers, bool, str, String, Uuid, and references and \
            Options of them; use such a field or implement `KeyPart` for your type"
)]
pub trait KeyPart {
    /// Appends this value's key text to `out`. Writing nothing means "absent".
    fn write_key_part(&self, out: &mut String);
}

macro_rules! display_key_part {
    ($($ty:ty),* $(,)?) => {$(
        impl KeyPart for $ty {
            fn write_key_part(&self, out: &mut String) {
                // Writing to a String cannot fail.
                let _ = write!(out, "{self}");
            }
        }
    )*};
}

display_key_part!(u128, i128, bool);

macro_rules! unsigned_key_part {
    ($($ty:ty),* $(,)?) => {$(
        impl KeyPart for $ty {
            fn write_key_part(&self, out: &mut String) {
                write_decimal(out, *self as u64);
            }
        }
    )*};
}

macro_rules! signed_key_part {
    ($($ty:ty),* $(,)?) => {$(
        impl KeyPart for $ty {
            fn write_key_part(&self, out: &mut String) {
                if *self < 0 {
                    out.push('-');
                }
                write_decimal(out, self.unsigned_abs() as u64);
            }
        }
    )*};
}

// At most 64 bits: the integers of most keys, rendered per call, skip `fmt`'s machinery.
unsigned_key_part!(u8, u16, u32, u64, usize);
signed_key_part!(i8, i16, i32, i64, isize);

/// `n` in decimal, as `Display` writes it.
fn write_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

impl KeyPart for str {
    fn write_key_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl KeyPart for String {
    fn write_key_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl KeyPart for uuid::Uuid {
    fn write_key_part(&self, out: &mut String) {
        let _ = write!(out, "{}", self.hyphenated());
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &mut T {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Arc<T> {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Rc<T> {
    fn write_key_part(&self, out: &mut String) {
        (**self).write_key_part(out);
    }
}

impl KeyPart for Cow<'_, str> {
    fn write_key_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn write_key_part(&self, out: &mut String) {
        if let Some(value) = self {
            value.write_key_part(out);
        }
    }
}

/// The rule a key part broke; carried by [`Error::InvalidKey`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRule {
    /// The part is longer than its limit.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The part contains a character outside the allowed set.
    Charset {
        /// The first offending character.
        found: char,
        /// The allowed set, for the message.
        allowed: &'static str,
    },
    /// The part is empty where a value is required.
    Empty,
    /// A key given to an operator's tool (`redguard::admin`) that is not one redguard writes
    /// under this prefix.
    Foreign {
        /// The handle's prefix.
        prefix: String,
    },
}

impl fmt::Display for KeyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyRule::TooLong { len, max } => write!(f, "{len} bytes long, the limit is {max}"),
            KeyRule::Charset { found, allowed } => {
                write!(f, "contains {found:?}, only {allowed} are allowed")
            }
            KeyRule::Empty => f.write_str("is empty"),
            KeyRule::Foreign { prefix } => write!(
                f,
                "is not a key redguard writes under the prefix `{prefix}` \
                 (`{prefix}:<idem|lock|rate>:{{<scope>:<key>}}`, optionally followed by a \
                 companion such as `:fence`); refused"
            ),
        }
    }
}

const PART_CHARS: &str = "[A-Za-z0-9._@-]";
const TEXT_CHARS: &str = "[A-Za-z0-9._@:-]";

fn is_part_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-')
}

fn is_text_byte(b: u8) -> bool {
    is_part_byte(b) || b == b':'
}

/// Checks `value` against a charset and length; the first violation wins.
fn check(
    value: &str,
    max: usize,
    allowed: impl Fn(u8) -> bool,
    allowed_name: &'static str,
) -> Result<(), KeyRule> {
    if value.is_empty() {
        return Err(KeyRule::Empty);
    }
    // By bytes: every allowed character is ASCII, so the first byte refused starts the first
    // character refused.
    if let Some(at) = value.bytes().position(|b| !allowed(b)) {
        return Err(KeyRule::Charset {
            found: value[at..].chars().next().unwrap_or_default(),
            allowed: allowed_name,
        });
    }
    if value.len() > max {
        return Err(KeyRule::TooLong {
            len: value.len(),
            max,
        });
    }
    Ok(())
}

/// Validates configuration-side names (prefix, scope, scene) that end up inside keys.
pub(crate) fn check_name(what: &str, value: &str, max: usize) -> Result<()> {
    check(value, max, is_text_byte, TEXT_CHARS).map_err(|rule| Error::InvalidKey {
        part: what.to_owned(),
        rule,
    })
}

/// Renders a key: a template's placeholders filled ([`redguard::key`](crate::key())), or literal text and values
/// appended in order (`KeyBuilder::new().text(..).part(..)`, what the attributes expand into,
/// their templates parsed at compile time). Each value is checked as it is added.
///
/// ```
/// use redguard::key::KeyBuilder;
///
/// let key = KeyBuilder::new().text("stock:").part("sku", &"SK-2024.05").finish()?;
/// assert_eq!(key.as_str(), "stock:SK-2024.05");
/// assert_eq!(redguard::key("stock:{sku}").part("sku", "SK-2024.05").finish()?, key);
///
/// let err = KeyBuilder::new().text("user:").part("id", &"a:b").finish().unwrap_err();
/// assert!(matches!(err, redguard::Error::InvalidKey { .. }));
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Default)]
#[must_use = "a key builder does nothing until a guard takes it (or `.finish()`)"]
pub struct KeyBuilder {
    /// The key so far; with a template, its text followed by the values given so far (one
    /// buffer: a key built per call allocates once).
    buf: String,
    error: Option<Error>,
    /// Set by `redguard::key`: the template, filled at `finish`.
    template: Option<Template>,
}

/// Where a [`key`] template and the values given for its placeholders lie in the builder's
/// buffer: the text first, then each value's placeholder name followed by the value.
#[derive(Debug)]
struct Template {
    /// The text is `buf[..text]`.
    text: usize,
    /// The first value given (most templates have one placeholder: no allocation), then
    /// the others, in the order given; each checked as a part.
    first: Option<Given>,
    more: Vec<Given>,
}

/// A value given in the builder's buffer: its placeholder's name is `buf[start..mid]`, the
/// value `buf[mid..end]`.
#[derive(Debug, Clone, Copy)]
struct Given {
    start: usize,
    mid: usize,
    end: usize,
}

impl Template {
    fn given(&mut self) -> impl Iterator<Item = &mut Given> {
        self.first.iter_mut().chain(&mut self.more)
    }

    fn give(&mut self, given: Given) {
        match self.first {
            None => self.first = Some(given),
            Some(_) => self.more.push(given),
        }
    }

    /// Where the value given for placeholder `name` lies in `buf`, the first one if given
    /// twice.
    fn value(&self, buf: &str, name: &str) -> Option<std::ops::Range<usize>> {
        self.first
            .iter()
            .chain(&self.more)
            .find(|given| &buf[given.start..given.mid] == name)
            .map(|given| given.mid..given.end)
    }

    /// The template (`buf[..text]`) with every placeholder replaced by its value, checked
    /// as template text between them: appended to `buf`, then moved to its start.
    fn render(&self, buf: &mut String) -> Result<()> {
        let unusable = |buf: &str, why: String| {
            Error::Config(format!("key template {:?}: {why}", &buf[..self.text]))
        };
        let rendered = buf.len();
        let mut at = 0;
        while at < self.text {
            let rest = &buf[at..self.text];
            let (literal, open) = match rest.bytes().position(|b| b == b'{') {
                Some(open) => (at..at + open, Some(at + open + 1)),
                None => (at..self.text, None),
            };
            if !literal.is_empty() {
                let text = &buf[literal.clone()];
                check(text, MAX_KEY_LEN, is_text_byte, TEXT_CHARS).map_err(|rule| {
                    Error::InvalidKey {
                        part: format!("template text {text:?}"),
                        rule,
                    }
                })?;
                buf.extend_from_within(literal);
            }
            let Some(open) = open else { break };
            let close = buf[open..self.text]
                .bytes()
                .position(|b| b == b'}')
                .ok_or_else(|| unusable(buf, "a `{` is not closed".to_owned()))?;
            let name = &buf[open..open + close];
            let value = self.value(buf, name).ok_or_else(|| {
                unusable(
                    buf,
                    format!("placeholder `{name}` is not filled (call `.part(\"{name}\", ..)`)"),
                )
            })?;
            buf.extend_from_within(value);
            at = open + close + 1;
        }
        buf.drain(..rendered);
        Ok(())
    }

    fn has_placeholder(&self, buf: &str, name: &str) -> bool {
        let mut rest = &buf[..self.text];
        while let Some(open) = rest.bytes().position(|b| b == b'{') {
            rest = &rest[open + 1..];
            let close = rest.bytes().position(|b| b == b'}').unwrap_or(rest.len());
            if &rest[..close] == name {
                return true;
            }
            rest = &rest[close..];
        }
        false
    }
}

impl KeyBuilder {
    /// See [`redguard::key`](crate::key()).
    pub(crate) fn template(template: &str) -> Self {
        // Room for the values and the rendered key: one allocation for most keys.
        let mut buf = String::with_capacity(3 * template.len() + 64);
        buf.push_str(template);
        KeyBuilder {
            buf,
            error: None,
            template: Some(Template {
                text: template.len(),
                first: None,
                more: Vec::new(),
            }),
        }
    }

    /// Starts an empty key, to which [`text`](KeyBuilder::text) and
    /// [`part`](KeyBuilder::part) append.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends template text (from code, not from a request): `[A-Za-z0-9._@:-]`.
    pub fn text(mut self, text: &str) -> Self {
        if self.error.is_some() {
            return self;
        }
        if let Some(template) = &mut self.template {
            // Before the values given so far, which move along.
            self.buf.insert_str(template.text, text);
            template.text += text.len();
            for given in template.given() {
                given.start += text.len();
                given.mid += text.len();
                given.end += text.len();
            }
            return self;
        }
        match check(text, MAX_KEY_LEN, is_text_byte, TEXT_CHARS) {
            Ok(()) => self.buf.push_str(text),
            Err(rule) => {
                self.error = Some(Error::InvalidKey {
                    part: format!("template text {text:?}"),
                    rule,
                })
            }
        }
        self
    }

    /// The value of placeholder `name`, validated as a part (`[A-Za-z0-9._@-]`, at most
    /// [`MAX_PART_LEN`] bytes; `None` or empty is [`Error::MissingKey`]): filled into the
    /// template of [`redguard::key`](crate::key()), or appended.
    pub fn part<T: KeyPart + ?Sized>(mut self, name: &str, value: &T) -> Self {
        if self.error.is_some() {
            return self;
        }
        let Some(template) = &mut self.template else {
            let start = self.buf.len();
            value.write_key_part(&mut self.buf);
            if let Err(err) = checked_part(name, &self.buf[start..]) {
                self.error = Some(err);
                self.buf.truncate(start);
            }
            return self;
        };
        if !template.has_placeholder(&self.buf, name) {
            self.error = Some(Error::Config(format!(
                "key template {:?} has no placeholder `{{{name}}}`",
                &self.buf[..template.text]
            )));
            return self;
        }
        let start = self.buf.len();
        self.buf.push_str(name);
        let mid = self.buf.len();
        value.write_key_part(&mut self.buf);
        match checked_part(name, &self.buf[mid..]) {
            Ok(()) => template.give(Given {
                start,
                mid,
                end: self.buf.len(),
            }),
            Err(err) => {
                self.error = Some(err);
                self.buf.truncate(start);
            }
        }
        self
    }

    /// The rendered key, or the first rule it broke. Guards call this themselves; it is
    /// here for keys checked ahead of them.
    pub fn finish(mut self) -> Result<KeyBody> {
        if let Some(err) = self.error {
            return Err(err);
        }
        if let Some(template) = &self.template {
            template.render(&mut self.buf)?;
        }
        if self.buf.is_empty() {
            return Err(Error::InvalidKey {
                part: "key".to_owned(),
                rule: KeyRule::Empty,
            });
        }
        Ok(KeyBody(self.buf))
    }
}

/// A rendered value checked as a part; empty is missing.
fn checked_part(name: &str, rendered: &str) -> Result<()> {
    check(rendered, MAX_PART_LEN, is_part_byte, PART_CHARS).map_err(|rule| {
        if rule == KeyRule::Empty {
            Error::MissingKey {
                part: name.to_owned(),
            }
        } else {
            Error::InvalidKey {
                part: name.to_owned(),
                rule,
            }
        }
    })
}

/// What every guard takes as its key: a [`redguard::key`](crate::key()) template filled in (a [`KeyBuilder`]), a
/// [`KeyBody`] rendered before, or plain text (`&str`, `String`: `[A-Za-z0-9._@:-]`, checked as
/// template text; render request values with [`KeyBuilder::part`] instead, which also rejects
/// `:`). A key that broke a rule is reported when the guard runs, so no call site has a
/// `finish()?` to forget.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// let rg = redguard::Redguard::memory();
/// let id = 42u64;
/// rg.lock("reports:daily").try_acquire().await?;
/// rg.limiter(redguard::key("login:{id}").part("id", &id)).rate("5/min").check().await?;
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a redguard key",
    label = "a guard takes `redguard::key(\"..{{name}}..\").part(\"name\", &value)`, a `&str` or a `KeyBody`",
    note = "render request values with `redguard::key(template).part(name, &value)`"
)]
pub trait IntoKey {
    /// The validated body.
    fn into_key(self) -> Result<KeyBody>;
}

impl IntoKey for KeyBody {
    fn into_key(self) -> Result<KeyBody> {
        Ok(self)
    }
}

impl IntoKey for Result<KeyBody> {
    fn into_key(self) -> Result<KeyBody> {
        self
    }
}

impl IntoKey for KeyBuilder {
    fn into_key(self) -> Result<KeyBody> {
        self.finish()
    }
}

impl IntoKey for &str {
    fn into_key(self) -> Result<KeyBody> {
        KeyBuilder::new().text(self).finish()
    }
}

impl IntoKey for String {
    fn into_key(self) -> Result<KeyBody> {
        self.as_str().into_key()
    }
}

impl IntoKey for &String {
    fn into_key(self) -> Result<KeyBody> {
        self.as_str().into_key()
    }
}

/// A rendered, validated key template: the part of a key that comes from a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyBody(String);

impl KeyBody {
    /// The rendered text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Which guard a key belongs to; its name is the second segment of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GuardKind {
    /// `#[idempotent]` records.
    Idempotency,
    /// `#[dist_lock]` keys.
    Lock,
    /// `#[rate_limit]` state.
    RateLimit,
    /// Idempotency tokens issued by [`Tokens`](crate::tokens::Tokens).
    Token,
}

impl GuardKind {
    /// The segment written into keys.
    pub fn as_str(self) -> &'static str {
        match self {
            GuardKind::Idempotency => "idem",
            GuardKind::Lock => "lock",
            GuardKind::RateLimit => "rate",
            GuardKind::Token => "token",
        }
    }
}

/// A full store key, `<prefix>:<guard>:{<scope>:<body>}`, checked against [`MAX_KEY_LEN`].
#[derive(Debug, Clone)]
pub struct Key {
    /// Boxed, with the tag's bounds in `u32`: a key is as small as the `String` it was (24
    /// bytes), and guards' states that hold several move no more.
    text: Box<str>,
    /// Where [`Key::hash_tag`] lies in `text` (start, end): found once, as the memory store's
    /// shard pick and the Redis store's slot grouping read it on every call.
    tag: [u32; 2],
}

impl Key {
    /// Assembles a key. `prefix` was validated when the handle was built; `scope` is checked
    /// here because the runtime APIs take it from callers.
    pub(crate) fn new(prefix: &str, guard: GuardKind, scope: &str, body: &KeyBody) -> Result<Key> {
        check_name("scope", scope, MAX_SCOPE_LEN)?;
        let guard = guard.as_str();
        let mut text =
            String::with_capacity(prefix.len() + guard.len() + scope.len() + body.0.len() + 5);
        text.push_str(prefix);
        text.push(':');
        text.push_str(guard);
        text.push_str(":{");
        let open = text.len();
        text.push_str(scope);
        text.push(':');
        text.push_str(&body.0);
        let close = text.len();
        text.push('}');
        if text.len() > MAX_KEY_LEN {
            return Err(Error::InvalidKey {
                part: "key".to_owned(),
                rule: KeyRule::TooLong {
                    len: text.len(),
                    max: MAX_KEY_LEN,
                },
            });
        }
        // No part holds a brace (each was checked against a charset without them): the tag
        // is the braces written here.
        let tag = tag(open..close);
        debug_assert_eq!(hash_tag(&text), tag, "{text}");
        // Of its exact capacity: boxed without a copy.
        Ok(Key {
            text: text.into_boxed_str(),
            tag,
        })
    }

    /// A key as read back from the store (a `SCAN`), or one an operator typed after
    /// `redguard::admin` checked it: not re-rendered.
    pub(crate) fn stored(key: impl Into<String>) -> Key {
        let text: Box<str> = key.into().into_boxed_str();
        let tag = hash_tag(&text);
        Key { text, tag }
    }

    /// The key as sent to the store.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The part of the key Redis Cluster hashes to pick its slot: the text between the first
    /// `{` and the next `}` when that is not empty, else the whole key. Keys with the same
    /// tag share a slot (and a shard of the memory store).
    pub(crate) fn hash_tag(&self) -> &str {
        let [start, end] = self.tag.map(|at| at as usize);
        self.text.get(start..end).unwrap_or(&self.text)
    }

    /// A companion key of the same guard state (e.g. a lock's fencing counter): `suffix`
    /// goes after the hash tag, so both keys land in the same Redis Cluster slot.
    pub(crate) fn companion(&self, suffix: &str) -> Key {
        // Not `format!`: its machinery costs more than the copy, once per check.
        Key {
            text: join(&[&self.text, ":", suffix]).into_boxed_str(),
            tag: self.tag,
        }
    }
}

/// Where the hash tag of `key` lies, as Redis Cluster finds it.
fn hash_tag(key: &str) -> [u32; 2] {
    // By bytes: `str`'s char searcher costs more than these keys' length.
    let open = key.bytes().position(|b| b == b'{');
    open.and_then(|open| {
        let close = key[open + 1..].bytes().position(|b| b == b'}')?;
        Some(open + 1..open + 1 + close)
    })
    .filter(|tag| !tag.is_empty())
    .map_or_else(|| tag(0..key.len()), tag)
}

/// A range of a key in `u32`. Redis keeps no key over 512 MB; a longer text (never read from
/// a store) gets a range [`Key::hash_tag`] refuses, and so hashes whole.
fn tag(range: Range<usize>) -> [u32; 2] {
    match (u32::try_from(range.start), u32::try_from(range.end)) {
        (Ok(start), Ok(end)) => [start, end],
        _ => [u32::MAX, 0],
    }
}

// By the text alone: the tag is a function of it.
impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.text == other.text
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

/// `parts` in one `String` of the exact length.
pub(crate) fn join(parts: &[&str]) -> String {
    let mut joined = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    parts.iter().for_each(|part| joined.push_str(part));
    joined
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value renders the same however it is held: a wrapper that wrote nothing would give
    /// every call one shared key.
    #[test]
    fn wrapped_values_render_as_the_value() {
        fn rendered<T: KeyPart + ?Sized>(value: &T) -> String {
            KeyBuilder::new()
                .part("v", value)
                .finish()
                .unwrap()
                .as_str()
                .to_owned()
        }
        let mut n = 42u64;
        assert_eq!(rendered(&&n), "42");
        assert_eq!(rendered(&&mut n), "42");
        assert_eq!(rendered(&Box::new(42u64)), "42");
        assert_eq!(rendered(&Arc::new(42u64)), "42");
        assert_eq!(rendered(&Rc::new(42u64)), "42");
        assert_eq!(rendered(&Cow::Borrowed("sku-1")), "sku-1");
        assert_eq!(rendered(&Cow::<str>::Owned("sku-2".into())), "sku-2");
    }

    #[test]
    fn integers_render_as_they_display() {
        fn rendered<T: KeyPart>(value: T) -> String {
            let mut out = String::new();
            value.write_key_part(&mut out);
            out
        }
        assert_eq!(rendered(0u64), "0");
        assert_eq!(rendered(u64::MAX), u64::MAX.to_string());
        assert_eq!(rendered(usize::MAX), usize::MAX.to_string());
        assert_eq!(rendered(u8::MAX), "255");
        assert_eq!(rendered(-1i32), "-1");
        assert_eq!(rendered(i64::MIN), i64::MIN.to_string());
        assert_eq!(rendered(i8::MIN), "-128");
        assert_eq!(rendered(isize::MAX), isize::MAX.to_string());
        assert_eq!(rendered(1_000_000u32), "1000000");
    }

    #[test]
    fn an_empty_key_is_refused() {
        let err = KeyBuilder::new().finish().unwrap_err();
        assert!(
            matches!(&err, Error::InvalidKey { part, rule: KeyRule::Empty } if part == "key"),
            "{err:?}"
        );
        let err = KeyBuilder::template("").finish().unwrap_err();
        assert!(
            matches!(
                &err,
                Error::InvalidKey {
                    rule: KeyRule::Empty,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// A template renders as the appending form does, whatever order its parts come in, and
    /// checks its values and text alike.
    #[test]
    fn templates_render_like_the_appending_form() {
        let appended = KeyBuilder::new()
            .text("order:")
            .part("user", &7u64)
            .text(":")
            .part("id", "A-1")
            .finish()
            .unwrap();
        let filled = KeyBuilder::template("order:{user}:{id}")
            .part("id", "A-1")
            .part("user", &7u64)
            .finish()
            .unwrap();
        assert_eq!(filled, appended);
        assert_eq!(
            KeyBuilder::template("{a}{b}")
                .part("a", "1")
                .part("b", "2")
                .finish()
                .unwrap()
                .as_str(),
            "12"
        );
        assert_eq!(
            KeyBuilder::template("plain:text")
                .finish()
                .unwrap()
                .as_str(),
            "plain:text"
        );
        let err = KeyBuilder::template("u:{id}")
            .part("id", "a:b")
            .finish()
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidKey { part, .. } if part == "id"),
            "{err:?}"
        );
        let err = KeyBuilder::template("u:{id}")
            .part("id", &None::<u64>)
            .finish()
            .unwrap_err();
        assert!(
            matches!(&err, Error::MissingKey { part } if part == "id"),
            "{err:?}"
        );
        let err = KeyBuilder::template("u id:{id}")
            .part("id", "1")
            .finish()
            .unwrap_err();
        assert!(matches!(&err, Error::InvalidKey { .. }), "{err:?}");
    }

    /// A template's placeholders and its `.part` calls must match: a typo would otherwise
    /// give every call one shared key.
    #[test]
    fn a_template_and_its_parts_must_match() {
        let unfilled = KeyBuilder::template("stock:{sku}").finish().unwrap_err();
        assert!(
            matches!(&unfilled, Error::Config(m) if m.contains("`sku` is not filled")),
            "{unfilled:?}"
        );
        let unknown = KeyBuilder::template("stock:{sku}")
            .part("skew", "1")
            .finish()
            .unwrap_err();
        assert!(
            matches!(&unknown, Error::Config(m) if m.contains("no placeholder `{skew}`")),
            "{unknown:?}"
        );
        let open = KeyBuilder::template("stock:{sku")
            .part("sku", "1")
            .finish()
            .unwrap_err();
        assert!(matches!(&open, Error::Config(_)), "{open:?}");
        let body = KeyBuilder::template("stock:{sku}")
            .part("sku", "1")
            .into_key()
            .unwrap();
        assert_eq!(body.as_str(), "stock:1");
        assert!(
            "stock:{sku}".into_key().is_err(),
            "braces are not template text"
        );
    }

    #[test]
    fn rules_explain_themselves() {
        assert_eq!(
            KeyRule::TooLong { len: 300, max: 128 }.to_string(),
            "300 bytes long, the limit is 128"
        );
        assert_eq!(
            KeyRule::Charset {
                found: ' ',
                allowed: "letters"
            }
            .to_string(),
            "contains ' ', only letters are allowed"
        );
        assert_eq!(KeyRule::Empty.to_string(), "is empty");
    }

    #[test]
    fn the_first_character_refused_is_reported_whole() {
        for (value, found) in [("ab c", ' '), ("é", 'é'), ("a-日本", '日'), ("x🦀", '🦀')]
        {
            let err = redguard_key(value).unwrap_err();
            let rule = KeyRule::Charset {
                found,
                allowed: PART_CHARS,
            };
            assert!(
                matches!(&err, Error::InvalidKey { rule: r, .. } if *r == rule),
                "{value}: {err:?}"
            );
        }
        assert!(check("a:b", 10, is_text_byte, TEXT_CHARS).is_ok());
        assert_eq!(
            check("a:é", 10, is_part_byte, PART_CHARS),
            Err(KeyRule::Charset {
                found: ':',
                allowed: PART_CHARS
            })
        );
    }

    fn redguard_key(value: &str) -> Result<KeyBody> {
        crate::key("k:{v}").part("v", value).finish()
    }

    fn part(value: &dyn Fn(&mut String)) -> Result<KeyBody> {
        struct F<'a>(&'a dyn Fn(&mut String));
        impl KeyPart for F<'_> {
            fn write_key_part(&self, out: &mut String) {
                (self.0)(out)
            }
        }
        KeyBuilder::new().text("t:").part("p", &F(value)).finish()
    }

    fn render(value: &str) -> Result<KeyBody> {
        part(&|out| out.push_str(value))
    }

    #[test]
    fn typical_ids_are_accepted() {
        for ok in [
            "42",
            "SK-2024.05",
            "alice@example.com",
            "550e8400-e29b-41d4-a716-446655440000",
            "a_b",
            &"x".repeat(MAX_PART_LEN),
        ] {
            assert_eq!(render(ok).unwrap().as_str(), format!("t:{ok}"));
        }
        let id = uuid::Uuid::new_v4();
        let key = KeyBuilder::new().part("id", &id).finish().unwrap();
        assert_eq!(key.as_str(), id.to_string());
        let n = KeyBuilder::new().part("n", &-7i64).finish().unwrap();
        assert_eq!(n.as_str(), "-7");
    }

    #[test]
    fn hostile_parts_are_rejected() {
        let too_long = "x".repeat(MAX_PART_LEN + 1);
        for bad in [":", "{", "}", "a b", "a\nb", "*", "é", "a/b", "", &too_long] {
            let err = render(bad).unwrap_err();
            match (bad.is_empty(), err) {
                (true, Error::MissingKey { part }) => assert_eq!(part, "p"),
                (false, Error::InvalidKey { part, .. }) => assert_eq!(part, "p"),
                (_, other) => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn none_is_missing_not_skipped() {
        let none: Option<u64> = None;
        let err = KeyBuilder::new()
            .part("user_id", &none)
            .finish()
            .unwrap_err();
        assert!(matches!(err, Error::MissingKey { part } if part == "user_id"));
        let some = KeyBuilder::new()
            .part("user_id", &Some(5u64))
            .finish()
            .unwrap();
        assert_eq!(some.as_str(), "5");
    }

    #[test]
    fn first_error_is_kept() {
        let err = KeyBuilder::new()
            .part("a", "bad value")
            .part("b", "")
            .finish()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidKey { part, .. } if part == "a"));
    }

    #[test]
    fn the_hash_tag_is_read_as_redis_cluster_reads_it() {
        let tag = |key: &str| Key::stored(key).hash_tag().to_owned();
        assert_eq!(tag("a{b}{c}"), "b");
        assert_eq!(tag("a:{}:b"), "a:{}:b");
        assert_eq!(tag("a}{b"), "a}{b");
        assert_eq!(tag("no tag"), "no tag");
        assert_eq!(tag("x{y:z}:fence"), "y:z");
        let body = render("sku.1").unwrap();
        let key = Key::new("redguard", GuardKind::Lock, "app::f", &body).unwrap();
        assert_eq!(key.hash_tag(), format!("app::f:{}", body.as_str()));
        assert_eq!(key.companion("fence").hash_tag(), key.hash_tag());
        assert_eq!(Key::stored(key.as_str()), key);
        // A range past `u32` (a text over 4 GiB) reads as the whole key, without a panic.
        let past = Key {
            text: "a{b}".into(),
            tag: super::tag(1..u32::MAX as usize + 1),
        };
        assert_eq!(past.hash_tag(), "a{b}");
    }

    #[test]
    fn full_key_has_hash_tag_and_limit() {
        let body = render("42").unwrap();
        let key = Key::new("redguard", GuardKind::Lock, "app::f", &body).unwrap();
        assert_eq!(key.as_str(), "redguard:lock:{app::f:t:42}");
        let long_scope = "s".repeat(MAX_SCOPE_LEN);
        let mut builder = KeyBuilder::new();
        for _ in 0..5 {
            builder = builder.text(":").part("p", &"y".repeat(MAX_PART_LEN));
        }
        let body = builder.finish().unwrap();
        let err = Key::new("redguard", GuardKind::Lock, &long_scope, &body).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidKey {
                rule: KeyRule::TooLong { .. },
                ..
            }
        ));
        assert!(Key::new("redguard", GuardKind::Lock, "a{b", &render("1").unwrap()).is_err());
    }
}
