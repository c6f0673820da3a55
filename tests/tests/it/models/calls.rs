//! Idempotent calls through the runtime (`Idempotency::run`, with payloads and tokens):
//! calls that return at once (a value, a business error, an unknown outcome), calls whose
//! body is held open while others arrive for the same intent and finish later, calls
//! dropped while their body runs or (on Redis) while their begin is in flight, tokens
//! issued, and clock advances. The expected answer of every call — run, replay, in
//! progress, key reuse, token used / unknown / mismatch — comes from the record and token
//! models, driven by the guide's rules (a token is consumed only when the body is about to
//! run, given back after a business error; a record begun for a refused token goes; an
//! unknown outcome, or a call dropped while its body runs, leaves the record UNKNOWN).
//!
//! On the memory store the runtime's timers run on paused Tokio time moved with the clock,
//! so a held body's record is renewed every `expire`/3 as the guide says, and the model renews
//! it at the same instants. On Redis the timers run on real time, far slower than the
//! virtual clock (expire 60 s: a renewal every 20 s of real time, never within a case), so
//! there the model renews nothing and a held body's record expires on the virtual clock.

use std::cell::Cell;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use redguard::{Classify, Error, ErrorClass, key::GuardKind, key::KeyBuilder};
use redguard_tests::model::idem::{Begin, Finish, IdemModel, Status};
use redguard_tests::model::token::{Consume, TokenModel};
use redguard_tests::props::disagreement;
use redguard_tests::vclock::{Backend, Expiry, World};
use tokio::sync::oneshot;

const INTENTS: [&str; 2] = ["i1", "i2"];
const PAYLOADS: [&str; 2] = ["p1", "p2"];
const TOKENS: [&str; 2] = ["t1", "t2"];
const SCENES: [&str; 2] = ["submit", "refund"];
/// Calls whose body can be held open at once.
const SLOTS: usize = 2;

/// How a body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Value,
    Business,
    Unknown,
}

#[derive(Clone)]
pub(crate) enum Op {
    /// A call on an intent, a token, or both; its body ends with `outcome`, or (`hold`) is
    /// held open in a slot.
    Call {
        intent: Option<usize>,
        payload: usize,
        token: Option<(usize, usize)>,
        outcome: Outcome,
        hold: bool,
    },
    /// A held body ends.
    Finish {
        slot: usize,
        outcome: Outcome,
    },
    /// A held call's future is dropped.
    Cancel {
        slot: usize,
    },
    /// A call on an intent dropped after its first poll.
    CancelEarly {
        intent: usize,
        token: Option<(usize, usize)>,
    },
    Issue {
        token: usize,
        scene: usize,
    },
    /// An advance by this many thirds of `expire`.
    Advance {
        thirds: u64,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = |intent: &Option<usize>, token: &Option<(usize, usize)>| {
            let mut parts = Vec::new();
            if let Some(i) = intent {
                parts.push(INTENTS[*i].to_owned());
            }
            if let Some((t, s)) = token {
                parts.push(format!("token {} in {}", TOKENS[*t], SCENES[*s]));
            }
            parts.join(" with ")
        };
        match self {
            Op::Call {
                intent,
                payload,
                token,
                outcome,
                hold,
            } => {
                write!(
                    f,
                    "call {} (payload {})",
                    on(intent, token),
                    PAYLOADS[*payload]
                )?;
                match hold {
                    true => write!(f, ", body held"),
                    false => write!(f, ", body ends {outcome:?}"),
                }
            }
            Op::Finish { slot, outcome } => write!(f, "held body #{slot} ends {outcome:?}"),
            Op::Cancel { slot } => write!(f, "held call #{slot} dropped"),
            Op::CancelEarly { intent, token } => {
                write!(
                    f,
                    "call {} dropped after its first poll",
                    on(&Some(*intent), token)
                )
            }
            Op::Issue { token, scene } => {
                write!(f, "issue {} for {}", TOKENS[*token], SCENES[*scene])
            }
            Op::Advance { thirds } => write!(f, "advance {thirds}/3 expire"),
        }
    }
}

pub(crate) struct Machine;

impl ReferenceStateMachine for Machine {
    /// Which slots hold a call.
    type State = [bool; SLOTS];
    type Transition = Op;

    fn init_state() -> BoxedStrategy<[bool; SLOTS]> {
        Just([false; SLOTS]).boxed()
    }

    fn transitions(_: &[bool; SLOTS]) -> BoxedStrategy<Op> {
        let intent = prop_oneof![4 => (0..INTENTS.len()).prop_map(Some), 1 => Just(None)];
        let token = prop_oneof![2 => Just(None), 1 => (0..TOKENS.len(), prop_oneof![3 => Just(0usize), 1 => Just(1usize)]).prop_map(Some)];
        let outcome =
            prop::sample::select(vec![Outcome::Value, Outcome::Business, Outcome::Unknown]);
        prop_oneof![
            6 => (intent, 0..PAYLOADS.len(), token.clone(), outcome.clone(), prop::bool::weighted(0.3))
                .prop_filter("a guarded call", |(intent, _, token, _, _)| intent.is_some() || token.is_some())
                .prop_map(|(intent, payload, token, outcome, hold)| Op::Call { intent, payload, token, outcome, hold }),
            2 => (0..SLOTS, outcome).prop_map(|(slot, outcome)| Op::Finish { slot, outcome }),
            1 => (0..SLOTS).prop_map(|slot| Op::Cancel { slot }),
            1 => (0..INTENTS.len(), token).prop_map(|(intent, token)| Op::CancelEarly { intent, token }),
            2 => (0..TOKENS.len(), 0..SCENES.len()).prop_map(|(token, scene)| Op::Issue { token, scene }),
            2 => prop::sample::select(vec![0u64, 1, 2, 3, 4]).prop_map(|thirds| Op::Advance { thirds }),
        ]
        .boxed()
    }

    fn preconditions(slots: &[bool; SLOTS], op: &Op) -> bool {
        match op {
            Op::Call { hold: true, .. } => slots.contains(&false),
            Op::Finish { slot, .. } | Op::Cancel { slot } => slots[*slot],
            _ => true,
        }
    }

    fn apply(mut slots: [bool; SLOTS], op: &Op) -> [bool; SLOTS] {
        match op {
            // A held call takes the first free slot (unless it ends at once, refused or
            // replayed: the test then finds the slot empty).
            Op::Call { hold: true, .. } => {
                if let Some(free) = slots.iter().position(|held| !held) {
                    slots[free] = true;
                }
            }
            Op::Finish { slot, .. } | Op::Cancel { slot } => slots[*slot] = false,
            _ => {}
        }
        slots
    }
}

/// The error type of a guarded body: a business failure, an unknown outcome, or the guard's.
#[derive(Debug)]
enum BodyError {
    Business,
    Unknown,
    Guard(Error),
}

impl From<Error> for BodyError {
    fn from(err: Error) -> Self {
        BodyError::Guard(err)
    }
}

impl Classify for BodyError {
    fn class(&self) -> ErrorClass {
        match self {
            BodyError::Business => ErrorClass::Business,
            BodyError::Unknown => ErrorClass::Indeterminate,
            BodyError::Guard(err) => err.class(),
        }
    }
}

/// A call's answer, as both sides print it: the value (a replay gives the first call's), or
/// the error's kind.
fn answer(result: Result<u32, BodyError>) -> String {
    match result {
        Ok(value) => format!("Ok({value})"),
        Err(BodyError::Guard(err)) => format!("{err:?}")
            .split([' ', '{', '('])
            .next()
            .unwrap_or_default()
            .to_owned(),
        Err(other) => format!("{other:?}"),
    }
}

type Call = Pin<Box<dyn Future<Output = Result<u32, BodyError>>>>;

/// A call whose body runs now: its future, and how to end the body.
struct Held {
    call: Call,
    finish: oneshot::Sender<Outcome>,
    /// The model's view: the execution's owner, its intent and token, its value.
    owner: String,
    intent: Option<usize>,
    token: Option<(usize, usize)>,
    value: u32,
    /// When its record is next renewed (µs), while the runtime renews it.
    renew_at: Option<u64>,
}

pub(crate) struct Sut {
    world: World,
    records: IdemModel,
    tokens: TokenModel,
    /// Each token name's current issue (a name issued again is a fresh token).
    issues: [u32; 2],
    slots: Vec<Option<Held>>,
    calls: u32,
    /// `expire`, µs.
    expire: u64,
    renews: bool,
    log: Vec<String>,
}

impl Sut {
    fn token_name(&self, token: usize) -> String {
        format!("{}g{}", TOKENS[token], self.issues[token])
    }

    /// The call's future: an `Idempotency` on the intent, the token, or both; the body
    /// returns `value`, or fails, as `ends` says once it is told.
    fn call(
        &self,
        intent: Option<usize>,
        payload: usize,
        token: Option<(usize, usize)>,
        value: u32,
    ) -> (Call, oneshot::Sender<Outcome>, Rc<Cell<bool>>) {
        let key = intent.map(|i| KeyBuilder::new().text(INTENTS[i]).finish().unwrap());
        let (tx, rx) = oneshot::channel();
        let started = Rc::new(Cell::new(false));
        let began = started.clone();
        let token = token.map(|(t, s)| (SCENES[s], self.token_name(t)));
        let expire = Duration::from_micros(self.expire);
        let call = async move {
            // Without a key: token mode alone, as `#[idempotent(token = ..)]` without `key`.
            let guard = match key {
                Some(key) => redguard::idempotency(key).scope("idem-calls"),
                None => redguard::__private::idempotency("idem-calls", None),
            };
            let mut guard = guard.expire(expire).payload(PAYLOADS[payload]);
            if let Some((scene, token)) = &token {
                guard = guard.token(*scene, token);
            }
            guard
                .run(async move {
                    began.set(true);
                    match rx.await.unwrap_or(Outcome::Unknown) {
                        Outcome::Value => Ok(value),
                        Outcome::Business => Err(BodyError::Business),
                        Outcome::Unknown => Err(BodyError::Unknown),
                    }
                })
                .await
        };
        (Box::pin(call), tx, started)
    }

    /// Runs `call` until its body starts (`None`) or it ends before (`Some`).
    fn start(&self, call: &mut Call, started: &Cell<bool>) -> Option<Result<u32, BodyError>> {
        self.world
            .block_on(poll_fn(|cx| match call.as_mut().poll(cx) {
                Poll::Ready(result) => Poll::Ready(Some(result)),
                Poll::Pending if started.get() => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }))
    }

    /// The model's begin of a call by `owner`: the answer when it ends before the body.
    fn model_begin(
        &mut self,
        owner: &str,
        intent: Option<usize>,
        payload: usize,
        token: Option<(usize, usize)>,
    ) -> Option<String> {
        let now = self.world.now();
        if let Some(i) = intent {
            match self
                .records
                .begin(INTENTS[i], owner, PAYLOADS[payload], self.expire, now)
            {
                Begin::Started | Begin::Retrying => {}
                Begin::InProgress => return Some("InProgress".to_owned()),
                Begin::Unknown => return Some("OutcomeUnknown".to_owned()),
                Begin::KeyReuse => return Some("KeyReuse".to_owned()),
                Begin::Done(bytes) => {
                    return Some(format!("Ok({})", String::from_utf8(bytes).unwrap()));
                }
            }
        }
        if let Some((t, s)) = token {
            let refused = match self
                .tokens
                .consume(&self.token_name(t), SCENES[s], owner, now)
            {
                Consume::Consumed => return None,
                Consume::AlreadyUsed => "TokenUsed",
                Consume::Unknown => "TokenUnknown",
                Consume::Mismatch => "TokenMismatch",
            };
            // The record begun for a refused token goes.
            if let Some(i) = intent {
                self.records.abandon(INTENTS[i], owner, now);
            }
            return Some(refused.to_owned());
        }
        None
    }

    /// The model's end of a body.
    fn model_finish(
        &mut self,
        owner: &str,
        intent: Option<usize>,
        token: Option<(usize, usize)>,
        value: u32,
        outcome: Outcome,
    ) -> String {
        let now = self.world.now();
        let record = |records: &mut IdemModel, finish| {
            if let Some(i) = intent {
                records.finish(INTENTS[i], owner, finish, self.expire, now);
            }
        };
        match outcome {
            Outcome::Value => {
                record(
                    &mut self.records,
                    Finish::Success(value.to_string().into_bytes()),
                );
                format!("Ok({value})")
            }
            Outcome::Business => {
                record(&mut self.records, Finish::Fail);
                if let Some((t, s)) = token {
                    self.tokens
                        .restore(&self.token_name(t), SCENES[s], owner, now);
                }
                "Business".to_owned()
            }
            Outcome::Unknown => {
                record(&mut self.records, Finish::Unknown);
                "Unknown".to_owned()
            }
        }
    }

    fn check(&mut self, op: &Op, got: String, expected: String) {
        self.log.push(format!("{op:?} → {got}"));
        if got != expected {
            panic!(
                "{}",
                disagreement(&self.log, format_args!("store {got}, model {expected}"))
            );
        }
    }

    /// Lets what the runtime spawned (undos) reach the store and be answered, and the held
    /// calls run (their bodies wait, their records' keep-alives renew when due).
    fn settle(&mut self) {
        let slots = &mut self.slots;
        self.world.block_on(async {
            for _ in 0..32 {
                poll_fn(|cx| {
                    for held in slots.iter_mut().flatten() {
                        assert!(
                            held.call.as_mut().poll(cx).is_pending(),
                            "a held body ended"
                        );
                    }
                    Poll::Ready(())
                })
                .await;
                tokio::task::yield_now().await;
            }
        });
        if self.world.backend != Backend::Memory {
            std::thread::sleep(Duration::from_millis(2));
            self.world.block_on(async {
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
            });
        }
    }
}

impl StateMachineTest for Machine {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(_: &[bool; SLOTS]) -> Sut {
        let world = World::new(Expiry::AtInstant, 0, super::mutation());
        let renews = world.backend == Backend::Memory;
        if renews {
            world.runtime.block_on(async { tokio::time::pause() });
        }
        let expire = if renews { 3_000_000 } else { 60_000_000 };
        Sut {
            world,
            records: IdemModel::default(),
            tokens: TokenModel::default(),
            issues: [0; 2],
            slots: (0..SLOTS).map(|_| None).collect(),
            calls: 0,
            expire,
            renews,
            log: vec![format!(
                "expire {} s, renewed every expire/3: {renews}",
                expire / 1_000_000
            )],
        }
    }

    fn apply(mut sut: Sut, ref_slots: &[bool; SLOTS], op: Op) -> Sut {
        match op.clone() {
            Op::Call {
                intent,
                payload,
                token,
                outcome,
                hold,
            } => {
                sut.calls += 1;
                let value = sut.calls;
                let owner = format!("call{value}");
                let (mut call, finish, started) = sut.call(intent, payload, token, value);
                let early = sut.start(&mut call, &started);
                let expected_early = sut.model_begin(&owner, intent, payload, token);
                match (early, expected_early) {
                    (Some(result), expected) => {
                        let expected = expected.unwrap_or_else(|| "the body running".to_owned());
                        sut.check(&op, answer(result), expected);
                    }
                    (None, Some(expected)) => {
                        sut.check(&op, "the body running".to_owned(), expected)
                    }
                    (None, None) if hold => {
                        // The slot the reference state gives it (see `Machine::apply`).
                        let free = ref_slots
                            .iter()
                            .zip(&sut.slots)
                            .position(|(taken, held)| *taken && held.is_none())
                            .expect("the reference state's slot");
                        let renew_at = (sut.renews && intent.is_some())
                            .then(|| sut.world.now() + sut.expire / 3);
                        sut.slots[free] = Some(Held {
                            call,
                            finish,
                            owner,
                            intent,
                            token,
                            value,
                            renew_at,
                        });
                        sut.log.push(format!("{op:?} → body #{free} running"));
                    }
                    (None, None) => {
                        let _ = finish.send(outcome);
                        let got = answer(sut.world.block_on(call));
                        let expected = sut.model_finish(&owner, intent, token, value, outcome);
                        sut.check(&op, got, expected);
                    }
                }
            }
            Op::Finish { slot, outcome } => {
                // The call meant for the slot may have ended before its body (refused,
                // replayed): the reference state cannot tell.
                let Some(held) = sut.slots[slot].take() else {
                    sut.log.push(format!("{op:?}: no body held there"));
                    return sut;
                };
                let _ = held.finish.send(outcome);
                let got = answer(sut.world.block_on(held.call));
                let expected =
                    sut.model_finish(&held.owner, held.intent, held.token, held.value, outcome);
                sut.check(&op, got, expected);
            }
            Op::Cancel { slot } => {
                // The record becomes UNKNOWN (recorded by a task the drop spawns), the token
                // stays used.
                let Some(held) = sut.slots[slot].take() else {
                    sut.log.push(format!("{op:?}: no call held there"));
                    return sut;
                };
                let runtime = sut.world.runtime.enter();
                let (owner, intent) = (held.owner.clone(), held.intent);
                drop(held);
                drop(runtime);
                sut.settle();
                if let Some(i) = intent {
                    let now = sut.world.now();
                    let expire = sut.expire;
                    sut.records
                        .finish(INTENTS[i], &owner, Finish::Unknown, expire, now);
                }
                sut.log.push(format!("{op:?}"));
            }
            Op::CancelEarly { intent, token } => {
                sut.calls += 1;
                let owner = format!("call{}", sut.calls);
                let (mut call, _finish, started) = sut.call(Some(intent), 0, token, sut.calls);
                let polled = sut
                    .world
                    .block_on(poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_ready())));
                let runtime = sut.world.runtime.enter();
                drop(call);
                drop(runtime);
                // Whatever the runtime spawned to undo it has run.
                sut.settle();
                if sut.world.backend == Backend::Memory {
                    // One poll runs the whole begin (the token consumed). When the handle's
                    // renewal task already sleeps until before the record's first renewal,
                    // the body starts in that poll too: dropped in it, its outcome is unknown.
                    // Otherwise the call waits for that task: dropped there, before its body,
                    // the call's record and token are given back.
                    if sut.model_begin(&owner, Some(intent), 0, token).is_none() {
                        let now = sut.world.now();
                        if started.get() {
                            let expire = sut.expire;
                            sut.records.finish(
                                INTENTS[intent],
                                &owner,
                                Finish::Unknown,
                                expire,
                                now,
                            );
                        } else {
                            sut.records.abandon(INTENTS[intent], &owner, now);
                            if let Some((t, s)) = token {
                                let name = sut.token_name(t);
                                sut.tokens.restore(&name, SCENES[s], &owner, now);
                            }
                        }
                    }
                } else {
                    // The begin may not have left yet (the client queues it on a later poll);
                    // if it did, it is undone. Either way a record it would begin goes (or
                    // never was), except a FAIL record: taken over and abandoned, it is gone;
                    // never reached, it stays. The store says which happened.
                    let now = sut.world.now();
                    let key = INTENTS[intent];
                    let failed = sut
                        .records
                        .records
                        .get(key)
                        .is_some_and(|r| r.status == Status::Fail);
                    if !failed || redis_status(&sut.world, intent).is_none() {
                        sut.records.begin(key, &owner, PAYLOADS[0], sut.expire, now);
                        sut.records.abandon(key, &owner, now);
                    }
                }
                sut.log.push(format!(
                    "{op:?} (body started: {}, done: {polled})",
                    started.get()
                ));
            }
            Op::Issue { token, scene } => {
                sut.issues[token] += 1;
                let name = sut.token_name(token);
                let ttl = Duration::from_secs(600);
                let issued = sut.world.block_on(issue(&name, SCENES[scene], ttl));
                let body = KeyBuilder::new().part("token", &name).finish().unwrap();
                let key = sut.world.rg.key(GuardKind::Token, "tokens", &body).unwrap();
                issued.expect("issue a token");
                sut.world.pin_expiry(key.as_str(), ttl);
                let now = sut.world.now();
                sut.tokens
                    .issue(&name, SCENES[scene], ttl.as_micros() as u64, now);
                sut.log.push(format!("{op:?}"));
            }
            Op::Advance { thirds } => {
                let by = sut.expire / 3 * thirds;
                sut.world.advance(by);
                if sut.renews {
                    // A ms more: Tokio's timers fire on whole-ms ticks, rounded up, and the
                    // ms of slack keeps a renewal due exactly now from slipping to the next
                    // advance (advances are whole thirds, far apart).
                    sut.world
                        .runtime
                        .block_on(tokio::time::advance(Duration::from_micros(by + 1000)));
                    sut.settle();
                    let now = sut.world.now();
                    // Each held body's keep-alive wakes once when due, renews at this instant,
                    // and sleeps expire/3 more; it stops at a renewal that finds the record lost.
                    for held in sut.slots.iter_mut().flatten() {
                        if let (Some(at), Some(i)) = (held.renew_at, held.intent)
                            && at <= now
                        {
                            let renewed =
                                sut.records.renew(INTENTS[i], &held.owner, sut.expire, now);
                            held.renew_at = renewed.then_some(now + sut.expire / 3);
                        }
                    }
                }
                sut.log.push(format!("{op:?}"));
            }
        }
        sut
    }
}

/// A token issued under a chosen name (the runtime's are random): the store's issue on the
/// key `tokens()` would use.
async fn issue(name: &str, scene: &str, ttl: Duration) -> redguard::Result<()> {
    let rg = redguard::Redguard::current()?;
    let body = KeyBuilder::new().part("token", name).finish()?;
    let key = rg.key(GuardKind::Token, "tokens", &body)?;
    redguard::__private::store::of(&rg)
        .token_issue(&key, scene, ttl, None)
        .await
}

/// The status field of the record of `intent` on Redis, once settled.
fn redis_status(world: &World, intent: usize) -> Option<String> {
    let body = KeyBuilder::new().text(INTENTS[intent]).finish().unwrap();
    let key = world
        .rg
        .key(GuardKind::Idempotency, "idem-calls", &body)
        .unwrap();
    world.node_urls().iter().find_map(|url| {
        let mut conn = redis::Client::open(url.as_str())
            .ok()?
            .get_connection()
            .ok()?;
        redis::cmd("HGET")
            .arg(key.as_str())
            .arg("status")
            .query::<Option<String>>(&mut conn)
            .ok()?
    })
}
