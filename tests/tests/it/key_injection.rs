//! Key injection: values from requests cannot make two different intents share a key, nor
//! reach outside the handle's prefix and the guard's hash tag. Checked over random strings
//! drawn mostly from the characters that matter (`:`, `{`, `}`, separators, non-ASCII).

use std::collections::HashMap;

use redguard::{Error, Redguard, key::GuardKind, key::KeyBuilder};

/// xorshift64*: deterministic, so a failure reproduces from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn string(&mut self) -> String {
        const ALPHABET: &[&str] = &[
            "a", "b", "1", ":", "{", "}", "-", ".", "_", "@", " ", "*", "\n", "é", "\0", "/", "::",
            "redguard", "idem", "}:{",
        ];
        let len = (self.next() % 8) as usize;
        (0..len)
            .map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize])
            .collect()
    }
}

#[test]
fn different_values_never_render_the_same_key() {
    let rg = Redguard::memory();
    let seed = 0x5eed_u64;
    let mut rng = Rng(seed);
    // Full key → the (user, request) pair that produced it.
    let mut seen: HashMap<String, (String, String)> = HashMap::new();
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..200_000 {
        let (user, request) = (rng.string(), rng.string());
        let body = KeyBuilder::new()
            .part("user", &user)
            .text(":")
            .part("request", &request)
            .finish();
        let body = match body {
            Ok(body) => body,
            Err(Error::InvalidKey { .. } | Error::MissingKey { .. }) => {
                rejected += 1;
                continue;
            }
            Err(other) => panic!("unexpected {other:?}"),
        };
        accepted += 1;
        let key = rg
            .key(GuardKind::Idempotency, "app::submit", &body)
            .expect("a valid body makes a valid key")
            .to_string();
        // The key stays inside our prefix, guard and a single hash tag.
        assert!(key.starts_with("redguard:idem:{app::submit:"), "{key}");
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        assert!(key.ends_with('}'), "{key}");
        if let Some(previous) = seen.insert(key.clone(), (user.clone(), request.clone())) {
            assert_eq!(
                previous,
                (user, request),
                "seed {seed:#x}: two intents share {key}"
            );
        }
    }
    println!(
        "{accepted} accepted, {rejected} rejected, {} distinct keys",
        seen.len()
    );
    assert!(
        accepted > 1_000 && rejected > 1_000,
        "the generator must exercise both sides"
    );
}
