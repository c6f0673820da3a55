//! Locks at the store seam: random sequences of acquisitions (named levels), renewals,
//! releases (levels, `hold_at_least` keeps), fair waiters joining, leaving and being handed
//! the lock, semaphore slots, readers and writers, by three owners, with clock advances that
//! cross leases, keeps and registrations. Every answer — fencing tokens, depths, the time
//! left on a holder's lease — is compared with the model exactly.

use std::fmt;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use redguard::__private::store::{
    Acquire as AcquireOp, LockAcquire, LockRelease, Release as ReleaseOp, rw_readers,
};
use redguard::{GuardKind, Key, KeyBuilder};
use redguard_tests::model::lock::{Acquire, LockModel, Release, readers};
use redguard_tests::props::disagreement;
use redguard_tests::vclock::{Expiry, World};

const OWNERS: [&str; 3] = ["A", "B", "C"];

/// Which lock an operation is on (each lives at its own key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Exclusive,
    Fair,
    /// A semaphore of this many permits.
    Semaphore(u32),
    /// The read/write lock, as a writer (true) or a reader.
    Rw(bool),
}

#[derive(Clone)]
pub(crate) enum Op {
    /// Level 1 takes the lock; n > 1 enters its n-th level. `join`: a fair waiter queues;
    /// for a writer, announces itself.
    Acquire {
        kind: Kind,
        owner: usize,
        lease_ms: u64,
        level: u32,
        join: bool,
    },
    Renew {
        kind: Kind,
        owner: usize,
        lease_ms: u64,
    },
    Release {
        kind: Kind,
        owner: usize,
        level: u32,
        keep_ms: u64,
    },
    /// A fair waiter giving up its place.
    Leave {
        owner: usize,
    },
    Advance {
        ms: u64,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Acquire {
                kind,
                owner,
                lease_ms,
                level,
                join,
            } => {
                write!(
                    f,
                    "{} acquires {kind:?} level {level} lease {lease_ms} ms",
                    OWNERS[*owner]
                )?;
                if *join {
                    write!(f, " (waiting)")?;
                }
                Ok(())
            }
            Op::Renew {
                kind,
                owner,
                lease_ms,
            } => {
                write!(f, "{} renews {kind:?} for {lease_ms} ms", OWNERS[*owner])
            }
            Op::Release {
                kind,
                owner,
                level,
                keep_ms,
            } => {
                write!(f, "{} releases {kind:?} level {level}", OWNERS[*owner])?;
                if *keep_ms > 0 {
                    write!(f, " keeping it {keep_ms} ms")?;
                }
                Ok(())
            }
            Op::Leave { owner } => write!(f, "{} leaves the fair queue", OWNERS[*owner]),
            Op::Advance { ms } => write!(f, "advance {ms} ms"),
        }
    }
}

pub(crate) struct Machine;

/// The lock kinds a case uses: mostly its own kind (so a case goes deep into one, a fair
/// queue's waiters coming and going, say), sometimes any.
fn kind(focus: usize) -> impl Strategy<Value = Kind> {
    let kinds = [
        Kind::Exclusive,
        Kind::Fair,
        Kind::Semaphore(2),
        Kind::Rw(true),
        Kind::Rw(false),
    ];
    let focused = match kinds[focus] {
        Kind::Rw(_) => any::<bool>().prop_map(Kind::Rw).boxed(),
        kind => Just(kind).boxed(),
    };
    // One semaphore key: its permits stay the same within a case.
    prop_oneof![4 => focused, 1 => prop::sample::select(kinds.to_vec())]
}

impl ReferenceStateMachine for Machine {
    /// Where the clock starts past the epoch (whole ms), and the case's kind of lock.
    type State = (u64, usize);
    type Transition = Op;

    fn init_state() -> BoxedStrategy<(u64, usize)> {
        (0u64..86_400_000, 0usize..4)
            .prop_map(|(ms, focus)| (ms * 1000, focus))
            .boxed()
    }

    fn transitions(&(_, focus): &(u64, usize)) -> BoxedStrategy<Op> {
        let owner = 0..OWNERS.len();
        let lease = prop::sample::select(vec![1000u64, 2000, 5000, 30_000]);
        let level = prop_oneof![3 => Just(1u32), 2 => 2u32..=4];
        let keep = prop_oneof![4 => Just(0u64), 1 => prop::sample::select(vec![500u64, 3000])];
        prop_oneof![
            5 => (kind(focus), owner.clone(), lease.clone(), level.clone(), any::<bool>()).prop_map(
                |(kind, owner, lease_ms, level, join)| Op::Acquire { kind, owner, lease_ms, level, join }
            ),
            1 => (kind(focus), owner.clone(), lease).prop_map(|(kind, owner, lease_ms)| Op::Renew { kind, owner, lease_ms }),
            4 => (kind(focus), owner.clone(), level, keep).prop_map(|(kind, owner, level, keep_ms)| {
                Op::Release { kind, owner, level, keep_ms }
            }),
            1 => owner.prop_map(|owner| Op::Leave { owner }),
            3 => prop::sample::select(vec![1u64, 199, 200, 500, 999, 1000, 1001, 2000, 2500, 3000, 5000, 30_000])
                .prop_map(|ms| Op::Advance { ms }),
        ]
        .boxed()
    }

    fn apply(state: (u64, usize), _: &Op) -> (u64, usize) {
        state
    }
}

pub(crate) struct Sut {
    world: World,
    model: LockModel,
    exclusive: Key,
    fair: Key,
    semaphore: Key,
    rw: Key,
    log: Vec<String>,
}

impl Sut {
    fn key(&self, kind: Kind) -> &Key {
        match kind {
            Kind::Exclusive => &self.exclusive,
            Kind::Fair => &self.fair,
            Kind::Semaphore(_) => &self.semaphore,
            Kind::Rw(_) => &self.rw,
        }
    }
}

/// The model's name for a key: the store key itself.
fn name(key: &Key) -> String {
    key.as_str().to_owned()
}

/// An acquisition by `owner` at `level` for `lease_ms`; `waiting` queues a fair waiter and
/// announces a writer.
fn acquire<'a>(
    key: &'a Key,
    owner: &'a str,
    lease_ms: u64,
    level: u32,
    waiting: bool,
) -> AcquireOp<'a> {
    AcquireOp {
        key,
        owner,
        lease: std::time::Duration::from_millis(lease_ms),
        level,
        waiting,
        replicas: None,
    }
}

fn release<'a>(key: &'a Key, owner: &'a str, level: u32, keep_ms: u64) -> ReleaseOp<'a> {
    ReleaseOp {
        key,
        owner,
        level,
        keep: std::time::Duration::from_millis(keep_ms),
    }
}

fn acquired(reply: LockAcquire) -> Acquire {
    match reply {
        LockAcquire::Acquired { fence, depth } => Acquire::Acquired { fence, depth },
        LockAcquire::Held { ttl } => Acquire::Held {
            ttl_us: ttl.as_micros() as u64,
        },
        LockAcquire::Lost => Acquire::Lost,
    }
}

fn released(reply: LockRelease) -> Release {
    match reply {
        LockRelease::Released => Release::Released,
        LockRelease::Nested { depth } => Release::Nested { depth },
        LockRelease::NotOwner => Release::NotOwner,
    }
}

impl StateMachineTest for Machine {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(&(start, _): &(u64, usize)) -> Sut {
        let world = World::new(Expiry::AtInstant, start, super::mutation());
        let key = |body: &str| {
            let body = KeyBuilder::new().text(body).finish().unwrap();
            world.rg.key(GuardKind::Lock, "lock-model", &body).unwrap()
        };
        Sut {
            exclusive: key("x"),
            fair: key("x.fair"),
            semaphore: key("x.sem"),
            rw: key("x.rw"),
            model: LockModel::default(),
            log: vec![format!("clock at EPOCH + {} ms", start / 1000)],
            world,
        }
    }

    fn apply(mut sut: Sut, _: &(u64, usize), op: Op) -> Sut {
        let now = sut.world.now();
        let ms = std::time::Duration::from_millis;
        let store = redguard::__private::store::of(&sut.world.rg).clone();
        let (got, expected): (String, String) = match op {
            Op::Advance { ms } => {
                sut.world.advance(ms * 1000);
                sut.log.push(format!("{op:?}"));
                return sut;
            }
            Op::Acquire {
                kind,
                owner,
                lease_ms,
                level,
                join,
            } => {
                let who = OWNERS[owner];
                let key = sut.key(kind).clone();
                let k = name(&key);
                let lease = lease_ms * 1000;
                let (got, expected) = match kind {
                    Kind::Exclusive => (
                        sut.world.block_on(
                            store.lock_acquire(acquire(&key, who, lease_ms, level, false)),
                        ),
                        sut.model.acquire(&k, who, lease, level, now),
                    ),
                    Kind::Fair => (
                        sut.world.block_on(
                            store.fair_acquire(acquire(&key, who, lease_ms, level, join)),
                        ),
                        sut.model.fair_acquire(&k, who, lease, level, join, now),
                    ),
                    Kind::Semaphore(permits) => (
                        sut.world.block_on(
                            store
                                .semaphore_acquire(acquire(&key, who, lease_ms, 1, false), permits),
                        ),
                        sut.model.sem_acquire(&k, who, permits, lease, now),
                    ),
                    Kind::Rw(write) => (
                        sut.world.block_on(
                            store.rw_acquire(acquire(&key, who, lease_ms, 1, join), write),
                        ),
                        sut.model.rw_acquire(&k, who, write, lease, join, now),
                    ),
                };
                let got = got.map(acquired);
                (
                    format!("{got:?}"),
                    format!("{:?}", Ok::<_, redguard::Error>(expected)),
                )
            }
            Op::Renew {
                kind,
                owner,
                lease_ms,
            } => {
                let who = OWNERS[owner];
                let key = sut.key(kind).clone();
                let lease = lease_ms * 1000;
                let (got, expected) = match kind {
                    Kind::Exclusive | Kind::Fair | Kind::Rw(true) => (
                        sut.world
                            .block_on(store.lock_renew(&key, who, ms(lease_ms))),
                        sut.model.renew(&name(&key), who, lease, now),
                    ),
                    Kind::Semaphore(_) => (
                        sut.world
                            .block_on(store.semaphore_renew(&key, who, ms(lease_ms))),
                        sut.model.holder_renew(&name(&key), who, lease, now),
                    ),
                    Kind::Rw(false) => (
                        sut.world.block_on(store.semaphore_renew(
                            &rw_readers(&key),
                            who,
                            ms(lease_ms),
                        )),
                        sut.model
                            .holder_renew(&readers(&name(&key)), who, lease, now),
                    ),
                };
                (
                    format!("{got:?}"),
                    format!("{:?}", Ok::<_, redguard::Error>(expected)),
                )
            }
            Op::Release {
                kind,
                owner,
                level,
                keep_ms,
            } => {
                let who = OWNERS[owner];
                let key = sut.key(kind).clone();
                let k = name(&key);
                let keep = keep_ms * 1000;
                let (got, expected) = match kind {
                    Kind::Exclusive | Kind::Rw(true) => (
                        sut.world
                            .block_on(store.lock_release(release(&key, who, level, keep_ms))),
                        sut.model.release(&k, who, level, keep, now),
                    ),
                    Kind::Fair => (
                        sut.world
                            .block_on(store.fair_release(release(&key, who, level, keep_ms))),
                        sut.model.fair_release(&k, who, level, keep, now),
                    ),
                    Kind::Semaphore(_) => (
                        sut.world.block_on(store.semaphore_release(&key, who)),
                        sut.model.holder_release(&k, who, now),
                    ),
                    Kind::Rw(false) => (
                        sut.world.block_on(store.rw_release_read(&key, who)),
                        sut.model.holder_release(&readers(&k), who, now),
                    ),
                };
                let got = got.map(released);
                (
                    format!("{got:?}"),
                    format!("{:?}", Ok::<_, redguard::Error>(expected)),
                )
            }
            Op::Leave { owner } => {
                let who = OWNERS[owner];
                let key = sut.fair.clone();
                let got = sut.world.block_on(store.fair_leave(&key, who));
                sut.model.fair_leave(&name(&key), who, now);
                (
                    format!("{got:?}"),
                    format!("{:?}", Ok::<_, redguard::Error>(())),
                )
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
