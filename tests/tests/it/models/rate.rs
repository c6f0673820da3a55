//! Rate limits: random sequences of stacked checks (consume and peek) and clock advances,
//! on keys whose limits change between calls (rate, burst, cost, algorithm, penalty), run
//! on the model and on each store, compared decision by decision, exactly.
//!
//! The limits of a case come from a palette drawn at its start: ordinary rates, rates at the
//! edges of the units (intervals of 1 ns, 2 ns, 1667 ns, 1 µs, 1.002 ms; counts just inside
//! the 0.1% tolerance), slow ones (per day, per 30 days), bursts far above the rate and costs
//! far above 1. Clock advances are drawn from the palette's intervals (k intervals, ± 1 µs),
//! so calls land on the boundaries where rounding decides.

use std::fmt;
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use redguard::__private::store::{RateCheck, RateMode};
use redguard::{Algorithm, GuardKind, Key, KeyBuilder, Limit, Rate};
use redguard_tests::model::rate::{LimitSpec, Mode, RateModel, Verdict, rate_accepted};
use redguard_tests::props::disagreement;
use redguard_tests::vclock::{EPOCH, Expiry, World};

/// Key names whose hash tags fall in the three thirds of the slot space, so on the test
/// Cluster each limit of a stacked call is on another master (`CLUSTER KEYSLOT` of
/// `{rate-model:a}`, `{rate-model:c}` and `{rate-model:d}` is 10872, 2618 and 15069).
const KEYS: [&str; 3] = ["a", "c", "d"];

/// A case: its palette of limits and where its clock starts within a 30-day period.
#[derive(Clone)]
pub(crate) struct Case {
    palette: Vec<LimitSpec>,
    offset_us: u64,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "clock at EPOCH + {} µs, limits ", self.offset_us)?;
        f.debug_list()
            .entries(self.palette.iter().enumerate().map(|(i, l)| Show(i, *l)))
            .finish()
    }
}

/// A limit, shown as `#i gcra 5/1s burst 10 cost 2 block 1s`.
struct Show(usize, LimitSpec);

impl fmt::Debug for Show {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.1;
        write!(f, "#{} {} {}/{:?}", self.0, l.algorithm, l.count, l.period)?;
        if let Some(burst) = l.burst {
            write!(f, " burst {burst}")?;
        }
        write!(f, " cost {}", l.cost)?;
        if !l.block.is_zero() {
            write!(f, " block {:?}", l.block)?;
        }
        Ok(())
    }
}

#[derive(Clone)]
pub(crate) enum Op {
    /// One call checking limits (palette index) on keys (index into [`KEYS`]) together.
    Check {
        mode: Mode,
        limits: Vec<(usize, usize)>,
    },
    Advance(u64),
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Advance(us) => write!(f, "advance {us} µs"),
            Op::Check { mode, limits } => {
                let what = if *mode == Mode::Peek { "peek" } else { "check" };
                let limits: Vec<String> = limits
                    .iter()
                    .map(|(key, limit)| format!("{} with #{limit}", KEYS[*key]))
                    .collect();
                write!(f, "{what} {}", limits.join(" + "))
            }
        }
    }
}

fn rate_class() -> impl Strategy<Value = (u64, Duration)> {
    let ms = Duration::from_millis;
    prop_oneof![
        4 => (1u64..=20, prop::sample::select(vec![ms(1), ms(7), ms(20), ms(100), ms(1000), ms(3000)])),
        // The edges of the units: whole µs, just under and over 1 µs, 1 and 2 ns, 1.002 ms,
        // the largest counts the 0.1% tolerance accepts around 1 ns and 1 µs intervals.
        3 => prop::sample::select(vec![
            (3, ms(1000)),
            (999, ms(1000)),
            (1000, ms(1000)),
            (1001, ms(1000)),
            (333_333, ms(1000)),
            (600_000, ms(1000)),
            (999_999, ms(1000)),
            (1_000_000, ms(1000)),
            (1_000_001, ms(1000)),
            (1_000_999, ms(1000)),
            (500_000_000, ms(1000)),
            (1_000_000_000, ms(1000)),
            (1000, ms(1)),
            (7, ms(20)),
        ]),
        1 => (1u64..=5, prop::sample::select(vec![ms(60_000), ms(86_400_000), ms(30 * 86_400_000)])),
    ]
}

fn limit() -> impl Strategy<Value = LimitSpec> {
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let block = prop_oneof![
        4 => Just(Duration::ZERO),
        1 => prop::sample::select(vec![Duration::from_millis(5), Duration::from_millis(700), Duration::from_secs(2)]),
    ];
    (
        algorithm,
        rate_class(),
        0u32..4,
        0u32..5,
        block,
        any::<prop::sample::Index>(),
    )
        .prop_map(
            |(algorithm, (count, period), burst_kind, cost_kind, block, pick)| {
                let burst = match burst_kind {
                    _ if algorithm.is_window() => None,
                    0 => None,
                    1 => Some(1),
                    2 => Some(count.saturating_mul(3).min(1_000_000_000)),
                    _ => Some(1 + pick.index(usize::try_from(count.min(1 << 20)).unwrap()) as u64),
                };
                let capacity = burst.unwrap_or(count);
                let cost = match cost_kind {
                    0 | 1 => 1,
                    2 => capacity,
                    3 => capacity.div_ceil(2),
                    _ => 1 + pick.index(usize::try_from(capacity.min(1 << 30)).unwrap()) as u64,
                };
                LimitSpec {
                    algorithm,
                    count,
                    period,
                    burst,
                    cost,
                    block,
                }
            },
        )
        .prop_filter("a limit the guide accepts", LimitSpec::valid)
        // A sliding log admitting a million calls a case would not finish.
        .prop_filter("a sliding log of a few entries", |l| {
            l.algorithm != Algorithm::SlidingWindow || l.count <= 10_000
        })
}

/// The window algorithms' limits of a palette on the first one's period (the guide: a window's
/// state counts calls within its own period, so changing the period of a live key is not a
/// change of limit the model can follow); their counts still vary. Limits that no longer fit
/// (a rate not accepted at that period) are dropped.
fn one_window_period(palette: Vec<LimitSpec>) -> Vec<LimitSpec> {
    let period = palette
        .iter()
        .find(|l| l.algorithm.is_window())
        .map(|l| l.period);
    palette
        .into_iter()
        .map(|l| match period {
            Some(period) if l.algorithm.is_window() => LimitSpec { period, ..l },
            _ => l,
        })
        .filter(LimitSpec::valid)
        .collect()
}

pub(crate) struct Machine;

impl ReferenceStateMachine for Machine {
    type State = Case;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Case> {
        (
            prop::collection::vec(limit(), 1..=4),
            0u64..30 * 86_400_000_000,
        )
            .prop_map(|(palette, offset_us)| Case {
                palette: one_window_period(palette),
                offset_us,
            })
            .prop_filter("a palette", |case| !case.palette.is_empty())
            .boxed()
    }

    fn transitions(case: &Case) -> BoxedStrategy<Op> {
        let n = case.palette.len();
        let intervals: Vec<u128> = case.palette.iter().map(LimitSpec::interval).collect();
        let periods: Vec<u64> = case
            .palette
            .iter()
            .map(|l| l.period.as_micros() as u64)
            .collect();
        let one_limit = (0..KEYS.len(), 0..n);
        let stacked = prop::sample::subsequence(vec![0, 1, 2], 1..=3).prop_flat_map(move |keys| {
            let k = keys.len();
            (Just(keys), prop::collection::vec(0..n, k))
                .prop_map(|(keys, limits)| keys.into_iter().zip(limits).collect::<Vec<_>>())
        });
        let mode = prop_oneof![6 => Just(Mode::Consume), 1 => Just(Mode::Peek)];
        let check = prop_oneof![
            3 => (mode.clone(), one_limit).prop_map(|(mode, l)| Op::Check { mode, limits: vec![l] }),
            2 => (mode, stacked).prop_map(|(mode, limits)| Op::Check { mode, limits }),
        ];
        // k intervals of a palette limit, exactly (rounded up to µs) or a µs either side.
        let by_interval =
            (prop::sample::select(intervals), 0u64..=4, -1i64..=1).prop_map(|(t, k, nudge)| {
                let us = (t * u128::from(k)).div_ceil(1000) as i64 + nudge;
                Op::Advance(us.max(0) as u64)
            });
        let by_period = (prop::sample::select(periods), 0u64..=2000)
            .prop_map(|(p, per_mille)| Op::Advance(p * per_mille / 1000));
        let advance = prop_oneof![
            2 => by_interval,
            2 => by_period,
            1 => (0u64..=3).prop_map(Op::Advance),
            1 => prop::sample::select(vec![1000u64, 600_000_000, 3_600_000_000]).prop_map(Op::Advance),
        ];
        prop_oneof![3 => check, 2 => advance].boxed()
    }

    fn apply(case: Case, _: &Op) -> Case {
        case
    }

    /// A shrunk palette drops the operations naming limits it no longer has.
    fn preconditions(case: &Case, op: &Op) -> bool {
        match op {
            Op::Check { limits, .. } => limits.iter().all(|(_, l)| *l < case.palette.len()),
            Op::Advance(_) => true,
        }
    }
}

pub(crate) struct Sut {
    world: World,
    model: RateModel,
    palette: Vec<LimitSpec>,
    keys: Vec<Key>,
    log: Vec<String>,
}

impl StateMachineTest for Machine {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(case: &Case) -> Sut {
        let world = World::new(Expiry::AfterMillisecond, case.offset_us, super::mutation());
        let keys = KEYS
            .iter()
            .map(|name| {
                let body = KeyBuilder::new().text(name).finish().unwrap();
                world
                    .rg
                    .key(GuardKind::RateLimit, "rate-model", &body)
                    .unwrap()
            })
            .collect();
        for (i, l) in case.palette.iter().enumerate() {
            check_validation(i, l);
        }
        Sut {
            world,
            model: RateModel::default(),
            palette: case.palette.clone(),
            keys,
            log: vec![format!("{case:?}")],
        }
    }

    fn apply(mut sut: Sut, _: &Case, op: Op) -> Sut {
        match &op {
            Op::Advance(us) => {
                sut.world.advance(*us);
                sut.log.push(format!("{op:?}"));
            }
            Op::Check { mode, limits } => {
                let now = sut.world.now();
                let specs: Vec<(String, LimitSpec)> = limits
                    .iter()
                    .map(|(key, l)| (KEYS[*key].to_owned(), sut.palette[*l]))
                    .collect();
                let expected = sut.model.check(&specs, now, *mode);
                let runtime_limits: Vec<Limit> = specs.iter().map(|(_, l)| to_limit(l)).collect();
                let checks: Vec<RateCheck<'_>> = limits
                    .iter()
                    .zip(&runtime_limits)
                    .map(|((key, _), limit)| RateCheck {
                        key: &sut.keys[*key],
                        limit,
                    })
                    .collect();
                let store_mode = match mode {
                    Mode::Consume => RateMode::Consume,
                    Mode::Peek => RateMode::Peek,
                };
                let outcome = sut
                    .world
                    .block_on(
                        redguard::__private::store::of(&sut.world.rg)
                            .rate_check(&checks, store_mode),
                    )
                    .unwrap_or_else(|err| panic!("{}", disagreement(&sut.log, err)));
                let got: Vec<Verdict> = outcome
                    .decisions
                    .iter()
                    .map(|d| Verdict {
                        allowed: d.allowed,
                        limit: d.limit,
                        remaining: d.remaining,
                        reset_us: d.reset_after.as_micros() as u64,
                        retry_us: d.retry_after.as_micros() as u64,
                        window: d.window,
                    })
                    .collect();
                sut.log.push(format!("{op:?} → {}", show(&got)));
                if got != expected || outcome.now.as_micros() as u64 != now {
                    let what = format!(
                        "at EPOCH + {} µs (store time EPOCH + {} µs)\n  store: {}\n  model: {}",
                        now - EPOCH_US,
                        outcome.now.as_micros() as u64 - EPOCH_US,
                        show(&got),
                        show(&expected)
                    );
                    panic!("{}", disagreement(&sut.log, format_args!("{what}")));
                }
            }
        }
        sut
    }
}

const EPOCH_US: u64 = EPOCH.as_micros() as u64;

fn show(verdicts: &[Verdict]) -> String {
    verdicts
        .iter()
        .map(|v| {
            format!(
                "{} remaining {} reset {} µs retry {} µs",
                if v.allowed { "allowed" } else { "rejected" },
                v.remaining,
                v.reset_us,
                v.retry_us
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn to_limit(l: &LimitSpec) -> Limit {
    let rate = Rate::new(l.count, l.period).expect("checked at the case's start");
    Limit::new(l.algorithm, rate, l.burst, l.cost, l.block).expect("checked at the case's start")
}

/// The runtime accepts exactly what the model (the guide) accepts, and counts the same interval.
fn check_validation(i: usize, l: &LimitSpec) {
    let rate = Rate::new(l.count, l.period);
    assert!(
        rate.is_ok(),
        "#{i}: Rate::new refused {}/{:?}: {:?}",
        l.count,
        l.period,
        rate
    );
    let limit = Limit::new(l.algorithm, rate.unwrap(), l.burst, l.cost, l.block);
    assert!(limit.is_ok(), "#{i}: Limit::new refused {l:?}: {limit:?}");
    assert_eq!(limit.unwrap().burst(), l.capacity());
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Around the limits of the units (1,000,000/s, where intervals turn to ns; 1 ns; the
    /// 0.1% tolerance), `Rate::new` accepts exactly the rates the guide accepts.
    #[test]
    fn rates_accepted_as_readme_says(
        count in prop_oneof![
            990_000u64..=1_010_000,
            1_000_000u64..=2_000_000,
            prop::sample::select(vec![333_333_333u64, 499_999_999, 500_000_000, 500_000_001, 999_999_999, 1_000_000_000, 1_000_000_001]),
            1u64..=1_000_000_000,
        ],
        period_ms in prop_oneof![Just(1000u64), 1u64..=3000],
    ) {
        let period = Duration::from_millis(period_ms);
        prop_assert_eq!(Rate::new(count, period).is_ok(), rate_accepted(count, period), "{}/{:?}", count, period);
    }
}
