//! Idempotency tokens as the guide describes them: issued for a scene with a TTL; consumed once
//! (a second use is told apart from an unknown token, and a token of another scene is left
//! untouched); given back by the execution that consumed it when its body failed cleanly;
//! gone at the end of its TTL, used or not.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenState {
    Live { scene: String },
    Used { by: String },
}

/// What a consumption found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consume {
    Consumed,
    AlreadyUsed,
    Unknown,
    Mismatch,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenModel {
    /// Token → state and expiry.
    pub tokens: BTreeMap<String, (TokenState, u64)>,
}

impl TokenModel {
    fn expire(&mut self, now: u64) {
        self.tokens.retain(|_, (_, expires)| *expires > now);
    }

    /// A fresh token for `scene`, living `ttl`.
    pub fn issue(&mut self, token: &str, scene: &str, ttl: u64, now: u64) {
        self.expire(now);
        let live = TokenState::Live {
            scene: scene.to_owned(),
        };
        self.tokens.insert(token.to_owned(), (live, now + ttl));
    }

    /// Uses the token up for `owner` (keeping its expiry).
    pub fn consume(&mut self, token: &str, scene: &str, owner: &str, now: u64) -> Consume {
        self.expire(now);
        let Some((state, _)) = self.tokens.get_mut(token) else {
            return Consume::Unknown;
        };
        match state {
            TokenState::Used { .. } => Consume::AlreadyUsed,
            TokenState::Live { scene: issued } if issued != scene => Consume::Mismatch,
            TokenState::Live { .. } => {
                *state = TokenState::Used {
                    by: owner.to_owned(),
                };
                Consume::Consumed
            }
        }
    }

    /// Gives back a token `owner` consumed, live again for `scene` until its old expiry.
    pub fn restore(&mut self, token: &str, scene: &str, owner: &str, now: u64) -> bool {
        self.expire(now);
        match self.tokens.get_mut(token) {
            Some((state, _))
                if *state
                    == (TokenState::Used {
                        by: owner.to_owned(),
                    }) =>
            {
                *state = TokenState::Live {
                    scene: scene.to_owned(),
                };
                true
            }
            _ => false,
        }
    }
}
