//! Methods of the same name on different impls (two inherent impls, two impls of one trait
//! for two instances of a generic type) guarded by attributes with the same key template:
//! random calls with shared ids and clock advances, compared with models that key every
//! record, rate budget and lock by the method's impl (the guide, "Keys": the default scope
//! names the impl type and trait). A shared scope shows up as a replay of another impl's
//! value, a budget used up by another impl, or a lock held by another impl.

use std::cell::Cell;
use std::fmt;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use std::future::{Future, poll_fn};
use std::task::Poll;

use redguard::Error;
use redguard_tests::model::idem::{Begin, Finish, IdemModel};
use redguard_tests::model::lock::{Acquire, LockModel};
use redguard_tests::model::rate::{LimitSpec, Mode, RateModel};
use redguard_tests::props::disagreement;
use redguard_tests::vclock::{Expiry, World};
use tokio::sync::oneshot;

thread_local! {
    /// Bodies run, per impl: a replay runs none.
    static RUNS: [Cell<u32>; 4] = Default::default();
}

fn ran(impl_: usize) {
    RUNS.with(|runs| runs[impl_].set(runs[impl_].get() + 1));
}

struct Orders;
struct Refunds;
struct Generic<T>(T);

trait Create {
    async fn create(&self, id: u64) -> Result<u64, Error>;
    async fn limited(&self, id: u64) -> Result<(), Error>;
}

impl Orders {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        ran(0);
        Ok(1000 + id)
    }

    #[redguard::rate_limit(key = "{id}", rate = "2/min")]
    async fn limited(&self, id: u64) -> Result<(), Error> {
        Ok(())
    }
}

impl Refunds {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        ran(1);
        Ok(2000 + id)
    }

    #[redguard::rate_limit(key = "{id}", rate = "2/min")]
    async fn limited(&self, id: u64) -> Result<(), Error> {
        Ok(())
    }
}

impl Create for Generic<u8> {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        ran(2);
        Ok(3000 + id)
    }

    #[redguard::rate_limit(key = "{id}", rate = "2/min")]
    async fn limited(&self, id: u64) -> Result<(), Error> {
        Ok(())
    }
}

impl Create for Generic<u16> {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        ran(3);
        Ok(4000 + id)
    }

    #[redguard::rate_limit(key = "{id}", rate = "2/min")]
    async fn limited(&self, id: u64) -> Result<(), Error> {
        Ok(())
    }
}

thread_local! {
    /// Set while a `hold` body runs.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Holds the lock until `gate` opens (at once without one).
async fn inside(gate: Option<oneshot::Receiver<()>>) -> Result<Option<u64>, Error> {
    INSIDE.with(|i| i.set(true));
    if let Some(gate) = gate {
        let _ = gate.await;
    }
    INSIDE.with(|i| i.set(false));
    Ok(redguard::lock::fence())
}

/// The lock methods: `skip_if_held`, one key template in each impl.
impl Orders {
    #[redguard::dist_lock(key = "{id}", skip_if_held)]
    async fn hold(
        &self,
        id: u64,
        gate: Option<oneshot::Receiver<()>>,
    ) -> Result<Option<u64>, Error> {
        inside(gate).await
    }
}

impl Refunds {
    #[redguard::dist_lock(key = "{id}", skip_if_held)]
    async fn hold(
        &self,
        id: u64,
        gate: Option<oneshot::Receiver<()>>,
    ) -> Result<Option<u64>, Error> {
        inside(gate).await
    }
}

async fn hold(
    impl_: usize,
    id: u64,
    gate: Option<oneshot::Receiver<()>>,
) -> Result<Option<u64>, Error> {
    match impl_ {
        0 => Orders.hold(id, gate).await,
        _ => Refunds.hold(id, gate).await,
    }
}

const IMPLS: [&str; 4] = [
    "Orders",
    "Refunds",
    "Generic<u8> as Create",
    "Generic<u16> as Create",
];

#[derive(Clone, Copy)]
pub(crate) enum Op {
    Create {
        impl_: usize,
        id: u64,
    },
    Limited {
        impl_: usize,
        id: u64,
    },
    /// `impl_`'s `hold(id)` (Orders or Refunds) while another call holds `held_by`'s.
    Hold {
        impl_: usize,
        id: u64,
        held_by: Option<usize>,
    },
    AdvanceSecs(u64),
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Create { impl_, id } => write!(f, "{}::create({id})", IMPLS[*impl_]),
            Op::Limited { impl_, id } => write!(f, "{}::limited({id})", IMPLS[*impl_]),
            Op::Hold { impl_, id, held_by } => {
                write!(f, "{}::hold({id})", IMPLS[*impl_])?;
                if let Some(other) = held_by {
                    write!(f, " while {}::hold({id}) is held", IMPLS[*other])?;
                }
                Ok(())
            }
            Op::AdvanceSecs(s) => write!(f, "advance {s} s"),
        }
    }
}

pub(crate) struct Machine;

impl ReferenceStateMachine for Machine {
    type State = ();
    type Transition = Op;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Op> {
        let id = 1u64..=2;
        prop_oneof![
            4 => (0..IMPLS.len(), id.clone()).prop_map(|(impl_, id)| Op::Create { impl_, id }),
            3 => (0..IMPLS.len(), id.clone()).prop_map(|(impl_, id)| Op::Limited { impl_, id }),
            2 => (0usize..2, id, prop::option::of(0usize..2)).prop_map(|(impl_, id, held_by)| Op::Hold { impl_, id, held_by }),
            1 => prop::sample::select(vec![1u64, 30, 60, 600]).prop_map(Op::AdvanceSecs),
        ]
        .boxed()
    }

    fn apply(state: (), _: &Op) {
        state
    }
}

pub(crate) struct Sut {
    world: World,
    records: IdemModel,
    budgets: RateModel,
    locks: LockModel,
    calls: u32,
    log: Vec<String>,
}

/// What every impl's attribute is, for the models: 2 per minute, GCRA, burst 2.
fn two_per_minute() -> LimitSpec {
    LimitSpec {
        algorithm: redguard::rate::Algorithm::Gcra,
        count: 2,
        period: std::time::Duration::from_secs(60),
        burst: None,
        cost: 1,
        block: std::time::Duration::ZERO,
    }
}

impl StateMachineTest for Machine {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(_: &()) -> Sut {
        RUNS.with(|runs| runs.iter().for_each(|r| r.set(0)));
        Sut {
            world: World::new(Expiry::AtInstant, 0, super::mutation()),
            records: IdemModel::default(),
            budgets: RateModel::default(),
            locks: LockModel::default(),
            calls: 0,
            log: Vec::new(),
        }
    }

    fn apply(mut sut: Sut, _: &(), op: Op) -> Sut {
        let now = sut.world.now();
        sut.calls += 1;
        let owner = format!("call{}", sut.calls);
        let (got, expected) = match op {
            Op::AdvanceSecs(s) => {
                sut.world.advance(s * 1_000_000);
                sut.log.push(format!("{op:?}"));
                return sut;
            }
            Op::Create { impl_, id } => {
                let before = RUNS.with(|runs| runs[impl_].get());
                let got = sut.world.block_on(async {
                    match impl_ {
                        0 => Orders.create(id).await,
                        1 => Refunds.create(id).await,
                        2 => Generic(0u8).create(id).await,
                        _ => Generic(0u16).create(id).await,
                    }
                });
                let runs = RUNS.with(|runs| runs[impl_].get()) - before;
                let key = format!("{}:{id}", IMPLS[impl_]);
                let value = 1000 * (impl_ as u64 + 1) + id;
                let expected = match sut.records.begin(&key, &owner, "", 600_000_000, now) {
                    Begin::Done(bytes) => (String::from_utf8(bytes).unwrap(), 0),
                    Begin::Started | Begin::Retrying => {
                        let result = value.to_string().into_bytes();
                        sut.records
                            .finish(&key, &owner, Finish::Success(result), 600_000_000, now);
                        (value.to_string(), 1)
                    }
                    other => (format!("{other:?}"), 0),
                };
                let got = match got {
                    Ok(v) => (v.to_string(), runs),
                    Err(err) => (format!("{err:?}"), runs),
                };
                (format!("{got:?}"), format!("{expected:?}"))
            }
            Op::Limited { impl_, id } => {
                let got = sut.world.block_on(async {
                    match impl_ {
                        0 => Orders.limited(id).await,
                        1 => Refunds.limited(id).await,
                        2 => Generic(0u8).limited(id).await,
                        _ => Generic(0u16).limited(id).await,
                    }
                });
                let key = format!("{}:{id}", IMPLS[impl_]);
                let verdict = sut
                    .budgets
                    .check(&[(key, two_per_minute())], now, Mode::Consume)[0];
                (format!("{}", got.is_ok()), format!("{}", verdict.allowed))
            }
            Op::Hold { impl_, id, held_by } => {
                // Another call holds `held_by`'s lock meanwhile: its body waits on a gate.
                let scope = |i: usize| format!("{}::hold:{id}", IMPLS[i]);
                let mut holder = None;
                if let Some(other) = held_by {
                    let (open, gate) = oneshot::channel();
                    let mut call = Box::pin(hold(other, id, Some(gate)));
                    let early = sut
                        .world
                        .block_on(poll_fn(|cx| match call.as_mut().poll(cx) {
                            Poll::Ready(result) => Poll::Ready(Some(result)),
                            Poll::Pending if INSIDE.with(Cell::get) => Poll::Ready(None),
                            Poll::Pending => Poll::Pending,
                        }));
                    assert!(
                        early.is_none(),
                        "the holder could not take its own lock: {early:?}"
                    );
                    sut.locks
                        .acquire(&scope(other), "holder", 30_000_000, 1, now);
                    holder = Some((other, open, call));
                }
                let got = sut.world.block_on(hold(impl_, id, None));
                let expected = match sut.locks.acquire(&scope(impl_), &owner, 30_000_000, 1, now) {
                    Acquire::Acquired { fence, .. } => {
                        sut.locks.release(&scope(impl_), &owner, 1, 0, now);
                        format!("Some({fence})")
                    }
                    _ => "LockHeld".to_owned(),
                };
                if let Some((other, open, call)) = holder {
                    let _ = open.send(());
                    let _ = sut.world.block_on(call);
                    sut.locks.release(&scope(other), "holder", 1, 0, now);
                }
                let got = match got {
                    Ok(fence) => format!("{fence:?}"),
                    Err(err) => format!("{err:?}")
                        .split([' ', '{'])
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                };
                (got, expected)
            }
        };
        sut.log.push(format!("{op:?} → {got}"));
        if got != expected {
            panic!(
                "{}",
                disagreement(&sut.log, format_args!("store {got}, model {expected}"))
            );
        }
        sut
    }
}
