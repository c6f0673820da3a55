//! Default scopes: the path of the guarded fn, impl type and trait included, as a key scope.
//!
//! An attribute only sees the fn it is on, not the `impl` around it, so expansions ask the
//! compiler: the type name of a fn item declared in the guarded fn's body is that fn's full
//! path — `shop::Orders::create::{{closure}}::__redguard_scope` in an inherent impl,
//! `<shop::PgOrders as shop::OrderStore>::create::…` in a trait impl. Two distinct fns (or
//! methods) have distinct paths, so they never share a key by default.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::key::MAX_SCOPE_LEN;

/// The name of the fn item expansions declare in the guarded fn's body.
const MARKER: &str = "__redguard_scope";

/// The scope of the fn whose body declares the marker fn with type name `path` (from
/// `type_name_of_val`), computed once per fn.
pub(crate) fn default_scope(cell: &'static OnceLock<Box<str>>, path: &'static str) -> &'static str {
    cell.get_or_init(|| from_path(path).into_boxed_str())
}

/// Turns a compiler path into a scope (`[A-Za-z0-9._@:-]`, at most [`MAX_SCOPE_LEN`] bytes):
///
/// - `shop::Orders::create` as it is (a free fn's scope is its module path and name);
/// - `<shop::PgOrders as shop::OrderStore>::create` → `shop::PgOrders@shop::OrderStore::create`
///   (`@` never appears in a Rust path, so this cannot meet an inherent method's scope);
/// - anything else outside the key alphabet (generic arguments, references, arrays) becomes
///   `.`, and a hash of the whole path is appended (`-1a2b3c4d`), so paths that differ only
///   there still differ; so does a path cut to fit the length limit.
fn from_path(path: &str) -> String {
    let path = path.strip_suffix(MARKER).unwrap_or(path);
    let path = path.strip_suffix("::").unwrap_or(path);
    // The body of an `async fn` is a closure to the compiler; so are closures around the
    // marker. They add nothing that tells two fns apart.
    let path = path.replace("::{{closure}}", "");
    let readable = match qualified(&path) {
        Some((ty, tr, rest)) => format!("{ty}@{tr}{rest}"),
        None => path.clone(),
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-' | ':');
    if readable.chars().all(allowed) && readable.len() <= MAX_SCOPE_LEN {
        return readable;
    }
    let mut scope: String = readable
        .chars()
        .map(|c| if allowed(c) { c } else { '.' })
        .collect();
    let digest = Sha256::digest(path.as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    // Room for `-` and the hash; the readable part is ASCII, so any cut is a char boundary.
    scope.truncate(MAX_SCOPE_LEN - 1 - hash.len());
    scope.push('-');
    scope.push_str(&hash);
    scope
}

/// Splits `<Type as Trait>::rest` into its three parts, the `<…>` matched by depth.
fn qualified(path: &str) -> Option<(&str, &str, &str)> {
    let inner = path.strip_prefix('<')?;
    let mut depth = 0usize;
    let close = inner.char_indices().find_map(|(i, c)| match c {
        '<' => {
            depth += 1;
            None
        }
        '>' if depth == 0 => Some(i),
        '>' => {
            depth -= 1;
            None
        }
        _ => None,
    })?;
    let (ty, tr) = inner[..close].rsplit_once(" as ")?;
    Some((ty, tr, &inner[close + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inherent_and_free_fns_keep_their_path() {
        assert_eq!(
            from_path("shop::Orders::create::{{closure}}::__redguard_scope"),
            "shop::Orders::create"
        );
        assert_eq!(
            from_path("shop::orders::submit::{{closure}}::__redguard_scope"),
            "shop::orders::submit"
        );
        // A raw identifier is printed without `r#`.
        assert_eq!(
            from_path("shop::Orders::match::{{closure}}::__redguard_scope"),
            "shop::Orders::match"
        );
    }

    #[test]
    fn trait_impls_name_type_and_trait() {
        assert_eq!(
            from_path("<shop::PgOrders as shop::Store>::create::{{closure}}::__redguard_scope"),
            "shop::PgOrders@shop::Store::create"
        );
    }

    #[test]
    fn other_characters_are_replaced_and_the_path_hashed() {
        let a = from_path("<shop::Repo<u8> as shop::Store>::create::__redguard_scope");
        let b = from_path("<shop::Repo<u16> as shop::Store>::create::__redguard_scope");
        let c = from_path("<shop::Repo<u8, u16> as shop::Store>::create::__redguard_scope");
        assert!(a.starts_with("shop::Repo.u8.@shop::Store::create-"), "{a}");
        for scope in [&a, &b, &c] {
            assert!(
                crate::key::check_name("scope", scope, MAX_SCOPE_LEN).is_ok(),
                "{scope}"
            );
        }
        assert_ne!(a, b);
        assert_ne!(a, c);
        let long = format!("{}::f::__redguard_scope", "m::".repeat(100));
        let scope = from_path(&long);
        assert_eq!(scope.len(), MAX_SCOPE_LEN);
        assert!(crate::key::check_name("scope", &scope, MAX_SCOPE_LEN).is_ok());
    }
}
