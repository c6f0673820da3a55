//! Nested lock levels through the runtime (`LockBuilder::run` inside `run`), with
//! cancellations: two tasks enter and leave levels of one lock; an entry may be dropped
//! after k polls (in flight on Redis, or with its body begun on memory), a level's release
//! may be dropped after k polls, and a whole task may be dropped with every level it holds.
//! The guide promises that each level is released at most once, by name: a nested release
//! sent again never frees the outer level under a running body, and a cancelled entry never
//! keeps the key after the outer release. After each step (once the releases and undos the
//! runtime spawned have run) a probe owner checks who holds the key, and on Redis the
//! depth the lock hash records; fences and depths are compared with the lock model, which
//! the documented behaviour maps every step onto.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use redguard::__private::store::{
    Acquire as AcquireOp, LockAcquire, LockRelease, Release as ReleaseOp,
};
use redguard::{Error, GuardKind, Key, KeyBuilder, Redguard};
use redguard_tests::model::lock::{Acquire, LockModel, Release};
use redguard_tests::props::disagreement;
use redguard_tests::vclock::{Backend, Expiry, World};
use tokio::sync::mpsc;

const TASKS: [&str; 2] = ["T1", "T2"];
/// The longest lease: renewed every 20 min of real time, never within a case, so the
/// time left on it is the model's.
const LEASE: Duration = Duration::from_secs(3600);
/// The runtime's default: a sixth entry is `LockTooDeep`.
const MAX_DEPTH: u32 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmd {
    /// Enter one more level (the lock itself, from no level): `run` inside the current body.
    Enter,
    /// The innermost body returns; its level is released.
    Leave,
    /// An entry whose future is dropped after this many polls.
    CancelEnter(u8),
    /// The innermost body returns and its release is dropped after this many more polls.
    CancelLeave(u8),
}

#[derive(Clone, Copy)]
pub(crate) enum Op {
    Do {
        task: usize,
        cmd: Cmd,
    },
    /// The task's future is dropped, every level it holds with it.
    DropTask {
        task: usize,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Do { task, cmd } => write!(f, "{} {cmd:?}", TASKS[*task]),
            Op::DropTask { task } => write!(f, "{} dropped", TASKS[*task]),
        }
    }
}

pub(crate) struct Machine;

/// The reference state is each task's depth, so leaving is only asked of a task inside.
impl ReferenceStateMachine for Machine {
    type State = [u32; 2];
    type Transition = Op;

    fn init_state() -> BoxedStrategy<[u32; 2]> {
        Just([0, 0]).boxed()
    }

    fn transitions(_: &[u32; 2]) -> BoxedStrategy<Op> {
        let task = 0..TASKS.len();
        let polls = 0u8..=3;
        prop_oneof![
            4 => task.clone().prop_map(|task| Op::Do { task, cmd: Cmd::Enter }),
            3 => task.clone().prop_map(|task| Op::Do { task, cmd: Cmd::Leave }),
            2 => (task.clone(), polls.clone()).prop_map(|(task, k)| Op::Do { task, cmd: Cmd::CancelEnter(k) }),
            2 => (task.clone(), polls).prop_map(|(task, k)| Op::Do { task, cmd: Cmd::CancelLeave(k) }),
            1 => task.prop_map(|task| Op::DropTask { task }),
        ]
        .boxed()
    }

    fn preconditions(depths: &[u32; 2], op: &Op) -> bool {
        match op {
            Op::Do {
                task,
                cmd: Cmd::Leave | Cmd::CancelLeave(_),
            } => depths[*task] > 0,
            _ => true,
        }
    }

    fn apply(mut depths: [u32; 2], op: &Op) -> [u32; 2] {
        let other = |t: usize| depths[1 - t];
        match *op {
            Op::Do {
                task,
                cmd: Cmd::Enter,
            } => {
                let d = depths[task];
                if (d == 0 && other(task) == 0) || (d > 0 && d < MAX_DEPTH) {
                    depths[task] += 1;
                }
            }
            Op::Do {
                task,
                cmd: Cmd::Leave | Cmd::CancelLeave(_),
            } => depths[task] -= 1,
            Op::Do {
                cmd: Cmd::CancelEnter(_),
                ..
            } => {}
            Op::DropTask { task } => depths[task] = 0,
        }
        depths
    }
}

/// What a task tells the harness after a command.
type Report = Result<u64, Error>;

/// What the levels of one task share: the handle, where to report, and the commands.
struct Ctx {
    rg: Redguard,
    reports: mpsc::UnboundedSender<Report>,
}

/// A running task: its future (the levels it is in) and where its commands go.
struct Task {
    future: Pin<Box<dyn Future<Output = ()>>>,
    commands: mpsc::UnboundedSender<Cmd>,
}

fn lock(rg: &Redguard) -> redguard::LockBuilder {
    rg.lock("nested")
        .scope("nested-model")
        .lease(LEASE)
        .skip_if_held()
}

/// Polls `future` up to `n` times, yielding to the runtime in between so replies can land;
/// true when it completed.
async fn poll_times<F: Future>(future: &mut Pin<Box<F>>, n: u8) -> bool {
    for _ in 0..n {
        if poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready())).await {
            return true;
        }
        tokio::task::yield_now().await;
    }
    false
}

/// One level's body (or the task outside any level): obeys commands until told to leave.
/// `released`: set when this body returns for a [`Cmd::CancelLeave`], telling its parent
/// how many polls of the release to allow before dropping it.
fn level<'a>(
    cx: &'a Ctx,
    commands: &'a mut mpsc::UnboundedReceiver<Cmd>,
    cancel_release: &'a std::cell::Cell<Option<u8>>,
) -> Pin<Box<dyn Future<Output = Result<(), Error>> + 'a>> {
    Box::pin(async move {
        // Entered: say so, with the fence of the level (the outer one's, when nested).
        let _ = cx.reports.send(Ok(redguard::fence().unwrap_or(0)));
        loop {
            let Some(cmd) = commands.recv().await else {
                return std::future::pending().await;
            };
            match cmd {
                Cmd::Leave => return Ok(()),
                Cmd::CancelLeave(k) => {
                    cancel_release.set(Some(k));
                    return Ok(());
                }
                Cmd::CancelEnter(k) => {
                    let mut entry =
                        Box::pin(lock(&cx.rg).run(std::future::pending::<Result<(), Error>>()));
                    // Done early only when refused (held, too deep): nothing to undo then.
                    poll_times(&mut entry, k).await;
                    drop(entry);
                    let _ = cx.reports.send(Ok(0));
                }
                Cmd::Enter => {
                    let child_cancel = std::cell::Cell::new(None);
                    let mut child = Box::pin(lock(&cx.rg).run(level(cx, commands, &child_cancel)));
                    let outcome = poll_fn(|task_cx| match child.as_mut().poll(task_cx) {
                        Poll::Ready(outcome) => Poll::Ready(Some(outcome)),
                        // The child's body returned for a cancelled release: its release is in
                        // flight now.
                        Poll::Pending if child_cancel.get().is_some() => Poll::Ready(None),
                        Poll::Pending => Poll::Pending,
                    })
                    .await;
                    let outcome = match outcome {
                        Some(outcome) => outcome,
                        None => {
                            // The release finishes within k polls, or is dropped in flight.
                            poll_times(&mut child, child_cancel.get().unwrap_or(0)).await;
                            drop(child);
                            Ok(())
                        }
                    };
                    // A refused entry (held, too deep) or a left level: report it.
                    let _ = cx.reports.send(outcome.map(|()| 0));
                }
            }
        }
    })
}

fn spawn_task(rg: &Redguard, reports: &mpsc::UnboundedSender<Report>) -> Task {
    let (commands, mut rx) = mpsc::unbounded_channel();
    let cx = Ctx {
        rg: rg.clone(),
        reports: reports.clone(),
    };
    let future = Box::pin(async move {
        let never = std::cell::Cell::new(None);
        let outside = level(&cx, &mut rx, &never);
        // The task outside any level reports "entered" first: swallowed by the harness.
        let _ = outside.await;
    });
    Task { future, commands }
}

pub(crate) struct Sut {
    world: World,
    model: LockModel,
    /// Each task's depth; the model knows a task's levels by the task's name.
    depths: [u32; 2],
    tasks: Vec<Task>,
    reports: mpsc::UnboundedReceiver<Report>,
    sender: mpsc::UnboundedSender<Report>,
    key: Key,
    log: Vec<String>,
}

impl Sut {
    /// Runs every task until one reports.
    fn next_report(&mut self) -> Report {
        let tasks = &mut self.tasks;
        let reports = &mut self.reports;
        self.world.block_on(poll_fn(|cx| {
            for task in tasks.iter_mut() {
                // A task never finishes: it waits for commands.
                let _ = task.future.as_mut().poll(cx);
            }
            match reports.poll_recv(cx) {
                Poll::Ready(report) => Poll::Ready(report.expect("a sender is kept")),
                Poll::Pending => Poll::Pending,
            }
        }))
    }

    /// Lets the releases and undos the runtime spawned reach the store, and waits for them:
    /// sent before the probe on the same connection, they are answered before it.
    fn settle(&mut self) {
        self.world.block_on(async {
            for _ in 0..32 {
                tokio::task::yield_now().await;
            }
        });
        if self.world.backend != Backend::Memory {
            // Their replies as well, so the next step starts from a quiet connection.
            std::thread::sleep(Duration::from_millis(2));
            self.world.block_on(async {
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
            });
        }
    }

    fn fail(&self, what: String) -> ! {
        panic!("{}", disagreement(&self.log, format_args!("{what}")));
    }
}

impl StateMachineTest for Machine {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(_: &[u32; 2]) -> Sut {
        let world = World::new(Expiry::AtInstant, 0, super::mutation());
        let (sender, reports) = mpsc::unbounded_channel();
        let body = KeyBuilder::new().text("nested").finish().unwrap();
        let key = world
            .rg
            .key(GuardKind::Lock, "nested-model", &body)
            .unwrap();
        let mut sut = Sut {
            tasks: Vec::new(),
            model: LockModel::default(),
            depths: [0, 0],
            reports,
            sender,
            key,
            log: vec!["two tasks, one lock (lease 1 h)".to_owned()],
            world,
        };
        for _ in TASKS {
            let fresh = spawn_task(&sut.world.rg, &sut.sender);
            sut.tasks.push(fresh);
            // Its "outside any level" report.
            let _ = sut.next_report();
        }
        sut
    }

    fn apply(mut sut: Sut, _: &[u32; 2], op: Op) -> Sut {
        // A ms per step: a new acquisition's fence is the clock, whatever a cancelled one
        // did to the counter.
        sut.world.advance(1000);
        let now = sut.world.now();
        let key = sut.key.as_str().to_owned();
        match op {
            Op::Do { task, cmd } => {
                sut.tasks[task].commands.send(cmd).expect("the task runs");
                let got = sut.next_report();
                let d = sut.depths[task];
                let who = TASKS[task];
                let expected = match cmd {
                    Cmd::Enter if d >= MAX_DEPTH => Err("LockTooDeep".to_owned()),
                    Cmd::Enter => {
                        match sut
                            .model
                            .acquire(&key, who, LEASE.as_micros() as u64, d + 1, now)
                        {
                            Acquire::Acquired { fence, .. } => {
                                sut.depths[task] += 1;
                                Ok(fence)
                            }
                            Acquire::Held { .. } => Err("LockHeld".to_owned()),
                            Acquire::Lost => Err("LockLost".to_owned()),
                        }
                    }
                    Cmd::Leave | Cmd::CancelLeave(_) => {
                        // Released by name, once, whether the release was awaited or sent again.
                        sut.model.release(&key, who, d, 0, now);
                        sut.depths[task] -= 1;
                        Ok(0)
                    }
                    // Not polled: never sent. Polled: sent (Redis sends on the first poll), then
                    // undone by name; a nested entry's lease extension stays, as documented.
                    Cmd::CancelEnter(0) => Ok(0),
                    Cmd::CancelEnter(_) => {
                        if d < MAX_DEPTH {
                            let lease = LEASE.as_micros() as u64;
                            sut.model.acquire(&key, who, lease, d + 1, now);
                            sut.model.release(&key, who, d + 1, 0, now);
                        }
                        Ok(0)
                    }
                };
                let got = got.map_err(|err| {
                    format!("{err:?}")
                        .split([' ', '{'])
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                });
                sut.log.push(format!("{op:?} → {got:?}"));
                if got != expected {
                    sut.fail(format!("store {got:?}, model {expected:?}"));
                }
            }
            Op::DropTask { task } => {
                let fresh = spawn_task(&sut.world.rg, &sut.sender);
                // Inside the runtime, as a cancelled caller is: its guards' drops spawn the
                // releases there.
                let runtime = sut.world.runtime.enter();
                drop(std::mem::replace(&mut sut.tasks[task], fresh));
                drop(runtime);
                let _ = sut.next_report();
                if sut.depths[task] > 0 {
                    sut.model.release(&key, TASKS[task], 1, 0, now);
                }
                sut.depths[task] = 0;
                sut.log.push(format!("{op:?}"));
            }
        }
        sut.settle();
        // The probe a ms later too: its fence is the clock's, whatever a cancelled entry did
        // to the counter in this one.
        sut.world.advance(1000);
        let now = sut.world.now();
        check_holder(&mut sut, now);
        sut
    }
}

/// A probe owner tries the key: free exactly when no task is in a level (and then takes
/// and gives it back, as the model does); on Redis the lock hash's depth is the holder's.
fn check_holder(sut: &mut Sut, now: u64) {
    let key = sut.key.as_str().to_owned();
    let store = redguard::__private::store::of(&sut.world.rg).clone();
    let probe = sut.world.block_on(store.lock_acquire(AcquireOp {
        key: &sut.key,
        owner: "probe",
        lease: LEASE,
        level: 1,
        waiting: false,
        replicas: None,
    }));
    let expected = sut
        .model
        .acquire(&key, "probe", LEASE.as_micros() as u64, 1, now);
    let got = match probe {
        Ok(LockAcquire::Acquired { fence, depth }) => Acquire::Acquired { fence, depth },
        Ok(LockAcquire::Held { ttl }) => Acquire::Held {
            ttl_us: ttl.as_micros() as u64,
        },
        Ok(LockAcquire::Lost) => Acquire::Lost,
        Err(err) => sut.fail(format!("probe: {err}")),
    };
    if got != expected {
        sut.fail(format!(
            "probe: store {got:?}, model {expected:?} (depths {:?})",
            sut.depths
        ));
    }
    if let Acquire::Acquired { .. } = got {
        let released = sut.world.block_on(store.lock_release(ReleaseOp {
            key: &sut.key,
            owner: "probe",
            level: 1,
            keep: Duration::ZERO,
        }));
        assert_eq!(released.ok(), Some(LockRelease::Released));
        assert_eq!(
            sut.model.release(&key, "probe", 1, 0, now),
            Release::Released
        );
    }
    if sut.world.backend == Backend::Redis {
        let depth = sut.model.locks.get(&key).map_or(0, |entry| entry.depth);
        let stored = redis_depth(&sut.world, &key);
        if stored != depth {
            sut.fail(format!(
                "the lock hash says depth {stored}, the model {depth} (depths {:?})",
                sut.depths
            ));
        }
    }
}

fn redis_depth(world: &World, key: &str) -> u32 {
    let url = world.node_urls()[0].clone();
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("HGET")
        .arg(key)
        .arg("depth")
        .query::<Option<u32>>(&mut conn)
        .unwrap()
        .unwrap_or(0)
}
