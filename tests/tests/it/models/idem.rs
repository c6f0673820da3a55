//! Idempotency records and tokens at the store seam: random begins (with and without a
//! fingerprint), renewals, abandons, finishes (SUCCESS, FAIL, UNKNOWN) by three executions
//! and operators' verdicts (forced or not) on two intents, and
//! tokens issued, consumed and given back in two scenes, with clock advances across the
//! records' and tokens' expiry; every answer compared with the models.

use std::fmt;
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use redguard::__private::store::{
    Begin, Finish as StoreFinish, IdemBegin, IdemFinish, IdemFinished, Resolve, Resolved,
    TokenOutcome,
};
use redguard::{GuardKind, Key, KeyBuilder};
use redguard_tests::model::idem::{Begin as Began, Finish, IdemModel, Resolved as Verdict};
use redguard_tests::model::token::{Consume, TokenModel};
use redguard_tests::props::disagreement;
use redguard_tests::vclock::{Expiry, World};

const OWNERS: [&str; 3] = ["A", "B", "C"];
const INTENTS: [&str; 2] = ["i1", "i2"];
const FINGERPRINTS: [&str; 3] = ["", "f1", "f2"];
const TOKENS: [&str; 2] = ["t1", "t2"];
const SCENES: [&str; 2] = ["submit", "refund"];

/// How an execution ends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    Success(u8),
    Fail,
    Unknown,
}

#[derive(Clone)]
pub(crate) enum Op {
    Begin {
        intent: usize,
        owner: usize,
        fp: usize,
        ttl_ms: u64,
    },
    Renew {
        intent: usize,
        owner: usize,
        ttl_ms: u64,
    },
    Abandon {
        intent: usize,
        owner: usize,
    },
    Finish {
        intent: usize,
        owner: usize,
        end: End,
        ttl_ms: u64,
    },
    /// An operator's verdict: `Some(result)`: SUCCESS with it; `None`: FAIL.
    Resolve {
        intent: usize,
        result: Option<u8>,
        force: bool,
    },
    Issue {
        token: usize,
        scene: usize,
        ttl_ms: u64,
    },
    Consume {
        token: usize,
        scene: usize,
        owner: usize,
    },
    Restore {
        token: usize,
        scene: usize,
        owner: usize,
    },
    Advance {
        ms: u64,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Begin {
                intent,
                owner,
                fp,
                ttl_ms,
            } => write!(
                f,
                "{} begins {} (fingerprint {:?}, expire {ttl_ms} ms)",
                OWNERS[*owner], INTENTS[*intent], FINGERPRINTS[*fp]
            ),
            Op::Renew {
                intent,
                owner,
                ttl_ms,
            } => {
                write!(
                    f,
                    "{} renews {} for {ttl_ms} ms",
                    OWNERS[*owner], INTENTS[*intent]
                )
            }
            Op::Abandon { intent, owner } => {
                write!(f, "{} abandons {}", OWNERS[*owner], INTENTS[*intent])
            }
            Op::Finish {
                intent,
                owner,
                end,
                ttl_ms,
            } => {
                let how = match end {
                    End::Success(r) => format!("SUCCESS {r}"),
                    End::Fail => "FAIL".to_owned(),
                    End::Unknown => "UNKNOWN".to_owned(),
                };
                write!(
                    f,
                    "{} finishes {} {how} (expire {ttl_ms} ms)",
                    OWNERS[*owner], INTENTS[*intent]
                )
            }
            Op::Resolve {
                intent,
                result,
                force,
            } => {
                let how = result.map_or("FAIL".to_owned(), |r| format!("SUCCESS {r}"));
                let force = if *force { ", forced" } else { "" };
                write!(f, "an operator resolves {} {how}{force}", INTENTS[*intent])
            }
            Op::Issue {
                token,
                scene,
                ttl_ms,
            } => {
                write!(
                    f,
                    "issue {} for {} ({ttl_ms} ms)",
                    TOKENS[*token], SCENES[*scene]
                )
            }
            Op::Consume {
                token,
                scene,
                owner,
            } => {
                write!(
                    f,
                    "{} consumes {} in {}",
                    OWNERS[*owner], TOKENS[*token], SCENES[*scene]
                )
            }
            Op::Restore {
                token,
                scene,
                owner,
            } => {
                write!(
                    f,
                    "{} gives {} back to {}",
                    OWNERS[*owner], TOKENS[*token], SCENES[*scene]
                )
            }
            Op::Advance { ms } => write!(f, "advance {ms} ms"),
        }
    }
}

pub(crate) struct Machine;

fn end() -> BoxedStrategy<End> {
    prop_oneof![
        2 => (0u8..3).prop_map(End::Success),
        1 => Just(End::Fail),
        1 => Just(End::Unknown),
    ]
    .boxed()
}

impl ReferenceStateMachine for Machine {
    /// Where the clock starts past the epoch (whole ms).
    type State = u64;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<u64> {
        (0u64..86_400_000).prop_map(|ms| ms * 1000).boxed()
    }

    fn transitions(_: &u64) -> BoxedStrategy<Op> {
        let intent = 0..INTENTS.len();
        let owner = 0..OWNERS.len();
        let ttl = prop::sample::select(vec![1000u64, 3000, 10_000]);
        let token = 0..TOKENS.len();
        let scene = prop_oneof![4 => Just(0usize), 1 => Just(1usize)];
        prop_oneof![
            4 => (intent.clone(), owner.clone(), 0..FINGERPRINTS.len(), ttl.clone())
                .prop_map(|(intent, owner, fp, ttl_ms)| Op::Begin { intent, owner, fp, ttl_ms }),
            1 => (intent.clone(), owner.clone(), ttl.clone())
                .prop_map(|(intent, owner, ttl_ms)| Op::Renew { intent, owner, ttl_ms }),
            1 => (intent.clone(), owner.clone()).prop_map(|(intent, owner)| Op::Abandon { intent, owner }),
            3 => (intent.clone(), owner.clone(), end(), ttl.clone())
                .prop_map(|(intent, owner, end, ttl_ms)| Op::Finish { intent, owner, end, ttl_ms }),
            1 => (intent, prop::option::of(0u8..3), any::<bool>())
                .prop_map(|(intent, result, force)| Op::Resolve { intent, result, force }),
            2 => (token.clone(), scene.clone(), ttl).prop_map(|(token, scene, ttl_ms)| Op::Issue { token, scene, ttl_ms }),
            3 => (token.clone(), scene.clone(), owner.clone())
                .prop_map(|(token, scene, owner)| Op::Consume { token, scene, owner }),
            1 => (token, scene, owner).prop_map(|(token, scene, owner)| Op::Restore { token, scene, owner }),
            3 => prop::sample::select(vec![1u64, 999, 1000, 1001, 3000, 10_000]).prop_map(|ms| Op::Advance { ms }),
        ]
        .boxed()
    }

    fn apply(start: u64, _: &Op) -> u64 {
        start
    }
}

pub(crate) struct Sut {
    world: World,
    records: IdemModel,
    tokens: TokenModel,
    intents: Vec<Key>,
    /// Each token name's current issue: a name issued again is a fresh token (tokens are
    /// random, so the store never sees one issued twice), and the old one is forgotten.
    issues: [u32; 2],
    log: Vec<String>,
}

impl Sut {
    /// The token `token` names now, and its store key.
    fn token(&self, token: usize) -> (String, Key) {
        let name = format!("{}g{}", TOKENS[token], self.issues[token]);
        let body = KeyBuilder::new().part("token", &name).finish().unwrap();
        let key = self
            .world
            .rg
            .key(GuardKind::Token, "tokens", &body)
            .unwrap();
        (name, key)
    }
}

/// How a store's successful answer prints, to compare with the model's.
fn ok(answer: impl fmt::Debug) -> String {
    format!("{:?}", Ok::<_, redguard::Error>(answer))
}

fn begun(reply: IdemBegin) -> Began {
    match reply {
        IdemBegin::Started => Began::Started,
        IdemBegin::Retrying => Began::Retrying,
        IdemBegin::InProgress => Began::InProgress,
        IdemBegin::Unknown => Began::Unknown,
        IdemBegin::Done(result) => Began::Done(result),
        IdemBegin::KeyReuse => Began::KeyReuse,
    }
}

fn consumed(reply: TokenOutcome) -> Consume {
    match reply {
        TokenOutcome::Consumed => Consume::Consumed,
        TokenOutcome::AlreadyUsed => Consume::AlreadyUsed,
        TokenOutcome::Unknown => Consume::Unknown,
        TokenOutcome::Mismatch => Consume::Mismatch,
    }
}

impl StateMachineTest for Machine {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(start: &u64) -> Sut {
        let world = World::new(Expiry::AtInstant, *start, super::mutation());
        let intents = INTENTS
            .iter()
            .map(|name| {
                let body = KeyBuilder::new().text(name).finish().unwrap();
                world
                    .rg
                    .key(GuardKind::Idempotency, "idem-model", &body)
                    .unwrap()
            })
            .collect();
        Sut {
            world,
            records: IdemModel::default(),
            tokens: TokenModel::default(),
            intents,
            issues: [0; 2],
            log: vec![format!("clock at EPOCH + {} ms", start / 1000)],
        }
    }

    fn apply(mut sut: Sut, _: &u64, op: Op) -> Sut {
        let now = sut.world.now();
        let ms = Duration::from_millis;
        let store = redguard::__private::store::of(&sut.world.rg).clone();
        let (got, expected) = match op {
            Op::Advance { ms } => {
                sut.world.advance(ms * 1000);
                sut.log.push(format!("{op:?}"));
                return sut;
            }
            Op::Begin {
                intent,
                owner,
                fp,
                ttl_ms,
            } => {
                let key = &sut.intents[intent];
                let got = sut
                    .world
                    .block_on(store.idem_begin(Begin {
                        key,
                        owner: OWNERS[owner],
                        fingerprint: FINGERPRINTS[fp],
                        ttl: ms(ttl_ms),
                        replicas: None,
                    }))
                    .map(begun);
                let expected = sut.records.begin(
                    INTENTS[intent],
                    OWNERS[owner],
                    FINGERPRINTS[fp],
                    ttl_ms * 1000,
                    now,
                );
                (format!("{got:?}"), ok(expected))
            }
            Op::Renew {
                intent,
                owner,
                ttl_ms,
            } => {
                let key = &sut.intents[intent];
                let got = sut
                    .world
                    .block_on(store.idem_renew(key, OWNERS[owner], ms(ttl_ms)));
                let expected =
                    sut.records
                        .renew(INTENTS[intent], OWNERS[owner], ttl_ms * 1000, now);
                (format!("{got:?}"), ok(expected))
            }
            Op::Abandon { intent, owner } => {
                let key = &sut.intents[intent];
                let got = sut.world.block_on(store.idem_abandon(key, OWNERS[owner]));
                sut.records.abandon(INTENTS[intent], OWNERS[owner], now);
                (format!("{got:?}"), ok(()))
            }
            Op::Finish {
                intent,
                owner,
                end,
                ttl_ms,
            } => {
                let key = &sut.intents[intent];
                let bytes = match end {
                    End::Success(r) => vec![b'0' + r],
                    End::Fail | End::Unknown => Vec::new(),
                };
                let (outcome, finish) = match end {
                    End::Success(_) => {
                        (IdemFinish::Success(&bytes), Finish::Success(bytes.clone()))
                    }
                    End::Fail => (IdemFinish::Fail, Finish::Fail),
                    End::Unknown => (IdemFinish::Unknown, Finish::Unknown),
                };
                let got = sut
                    .world
                    .block_on(store.idem_finish(StoreFinish {
                        key,
                        owner: OWNERS[owner],
                        outcome,
                        ttl: ms(ttl_ms),
                        replicas: None,
                    }))
                    .map(|f| f == IdemFinished::Recorded);
                let expected =
                    sut.records
                        .finish(INTENTS[intent], OWNERS[owner], finish, ttl_ms * 1000, now);
                (format!("{got:?}"), ok(expected))
            }
            Op::Resolve {
                intent,
                result,
                force,
            } => {
                let key = &sut.intents[intent];
                let bytes = result.map(|r| vec![b'0' + r]);
                let got = sut
                    .world
                    .block_on(store.idem_resolve(Resolve {
                        key,
                        result: bytes.as_deref(),
                        force,
                    }))
                    .map(|resolved| match resolved {
                        Resolved::Done(was) => Verdict::Done(was.as_str()),
                        Resolved::Refused(was) => Verdict::Refused(was.as_str()),
                        Resolved::Missing => Verdict::Missing,
                    });
                let expected = sut.records.resolve(INTENTS[intent], bytes, force, now);
                (format!("{got:?}"), ok(expected))
            }
            Op::Issue {
                token,
                scene,
                ttl_ms,
            } => {
                sut.issues[token] += 1;
                let (name, key) = sut.token(token);
                let got =
                    sut.world
                        .block_on(store.token_issue(&key, SCENES[scene], ms(ttl_ms), None));
                if got.is_ok() {
                    // A plain SET, not a script: its TTL is on Redis's clock.
                    sut.world.pin_expiry(key.as_str(), ms(ttl_ms));
                }
                sut.tokens.issue(&name, SCENES[scene], ttl_ms * 1000, now);
                (format!("{got:?}"), ok(()))
            }
            Op::Consume {
                token,
                scene,
                owner,
            } => {
                let (name, key) = sut.token(token);
                let got = sut
                    .world
                    .block_on(store.token_consume(&key, SCENES[scene], OWNERS[owner]))
                    .map(consumed);
                let expected = sut.tokens.consume(&name, SCENES[scene], OWNERS[owner], now);
                (format!("{got:?}"), ok(expected))
            }
            Op::Restore {
                token,
                scene,
                owner,
            } => {
                let (name, key) = sut.token(token);
                let got =
                    sut.world
                        .block_on(store.token_restore(&key, SCENES[scene], OWNERS[owner]));
                let expected = sut.tokens.restore(&name, SCENES[scene], OWNERS[owner], now);
                (format!("{got:?}"), ok(expected))
            }
        };
        sut.log.push(format!("{op:?} → {got}"));
        if got != expected {
            let what = format!("store {got}, model {expected}");
            panic!("{}", disagreement(&sut.log, format_args!("{what}")));
        }
        sut
    }
}
