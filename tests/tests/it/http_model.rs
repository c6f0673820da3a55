//! The HTTP contract as a model (`redguard_tests::model::http`): random request sequences
//! through a real `RateLimitLayer` → `IdempotencyLayer` → axum handler stack on the memory
//! store, Redis and a Redis Cluster — three clients, three keys, two payloads, handler
//! outcomes from `201` to a busy lock, a stream and an oversized body, concurrent duplicates
//! and clients that hang up mid-request — every response compared with the model's (status,
//! code, the handler's headers live, the replayed ones as bytes, binary bodies, the
//! `RateLimit` remaining), shrunk to the shortest failing sequence.
//!
//! A few dozen cases per store in CI; `PROPTEST_CASES` sets the count (a long run:
//! `PROPTEST_CASES=2000 cargo test -p redguard-tests --test it http_model`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt as _;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use redguard::admin::Admin;
use redguard::http::{HeaderKey, IdempotencyLayer, RateLimitLayer};
use redguard::{ErrorClass, key::GuardKind};
use redguard_tests::model::http::{
    CHECKED, Expect, HttpModel, MAX_RESPONSE, Outcome, QUOTA, REPLAYED, Record, Reply,
    handler_reply, refusal, replay_of,
};
use redguard_tests::props::{disagreement, run};
use redguard_tests::vclock::{Backend, Expiry, World};
use tower::ServiceExt as _;

const CLIENTS: u8 = 3;
const KEYS: u8 = 3;
const PAYLOADS: u8 = 2;
const MEMORY_CASES: u32 = 48;
const REDIS_CASES: u32 = 24;
const CLUSTER_CASES: u32 = 8;
const STEPS: usize = 24;

#[test]
fn http_model_memory() {
    run::<Machine>(Backend::Memory, MEMORY_CASES, STEPS);
}

#[test]
fn http_model_redis() {
    run::<Machine>(Backend::Redis, REDIS_CASES, STEPS);
}

#[test]
fn http_model_cluster() {
    run::<Machine>(Backend::Cluster, CLUSTER_CASES, STEPS);
}

#[derive(Clone)]
enum Op {
    Send {
        client: u8,
        key: u8,
        payload: u8,
        outcome: Outcome,
    },
    /// `n` identical requests at once; the handler takes a while.
    Duplicates {
        client: u8,
        key: u8,
        payload: u8,
        n: usize,
    },
    /// The client hangs up once the handler has started.
    HangUp { client: u8, key: u8, payload: u8 },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Send {
                client,
                key,
                payload,
                outcome,
            } => write!(
                f,
                "client {client}: key k{key}, payload {payload}, handler {outcome:?}"
            ),
            Op::Duplicates {
                client,
                key,
                payload,
                n,
            } => write!(
                f,
                "client {client}: {n} at once, key k{key}, payload {payload}"
            ),
            Op::HangUp {
                client,
                key,
                payload,
            } => write!(
                f,
                "client {client}: key k{key}, payload {payload}, hangs up"
            ),
        }
    }
}

struct Machine;

impl ReferenceStateMachine for Machine {
    type State = ();
    type Transition = Op;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Op> {
        let outcome = prop_oneof![
            4 => Just(Outcome::Created),
            2 => prop::sample::select(vec![400u16, 404, 409]).prop_map(Outcome::Rejected),
            1 => prop::sample::select(vec![500u16, 502]).prop_map(Outcome::ServerError),
            1 => Just(Outcome::Shed),
            1 => Just(Outcome::LockBusy),
            1 => Just(Outcome::Streamed),
            1 => Just(Outcome::TooLarge),
            1 => Just(Outcome::Panics),
        ];
        prop_oneof![
            8 => (0..CLIENTS, 0..KEYS, 0..PAYLOADS, outcome).prop_map(
                |(client, key, payload, outcome)| Op::Send { client, key, payload, outcome }
            ),
            1 => (0..CLIENTS, 0..KEYS, 0..PAYLOADS, 2usize..6)
                .prop_map(|(client, key, payload, n)| Op::Duplicates { client, key, payload, n }),
            1 => (0..CLIENTS, 0..KEYS, 0..PAYLOADS)
                .prop_map(|(client, key, payload)| Op::HangUp { client, key, payload }),
        ]
        .boxed()
    }

    fn apply(state: (), _: &Op) {
        state
    }
}

/// What the handler shares with the test: its run counter.
#[derive(Default)]
struct Shared {
    runs: AtomicU64,
}

struct Sut {
    world: World,
    app: Router,
    shared: Arc<Shared>,
    model: HttpModel,
    /// Held for the whole case: `Outcome::LockBusy` handlers find it taken.
    _busy: redguard::lock::LockGuard,
    log: Vec<String>,
}

impl StateMachineTest for Machine {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(_: &()) -> Sut {
        let world = World::new(Expiry::AtInstant, 0, None);
        let shared = Arc::new(Shared::default());
        let rg = world.rg.clone();
        let idempotency = IdempotencyLayer::builder()
            .max_response(MAX_RESPONSE)
            .replay_headers(REPLAYED.map(HeaderName::from_static))
            .on(&rg)
            .build()
            .unwrap();
        let limit = RateLimitLayer::builder(HeaderKey::new("x-client").unwrap())
            .limit("client", format!("{QUOTA}/h"))
            .on(&rg)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/orders", post(handler))
            .with_state(Arc::clone(&shared))
            .layer(idempotency)
            .layer(limit);
        let busy = world
            .block_on(rg.lock("busy").lease(Duration::from_secs(600)).acquire())
            .unwrap();
        Sut {
            world,
            app,
            shared,
            model: HttpModel::default(),
            _busy: busy,
            log: Vec::new(),
        }
    }

    fn apply(mut sut: Sut, _: &(), op: Op) -> Sut {
        sut.log.push(format!("{op:?}"));
        match op {
            Op::Send {
                client,
                key,
                payload,
                outcome,
            } => {
                let expected = match sut.model.admit(client) {
                    None => None,
                    Some(remaining) => Some((remaining, sut.model.request(key, payload, outcome))),
                };
                let app = sut.app.clone();
                let got = sut.world.block_on(async move {
                    let call = tokio::spawn(async move {
                        let response = app
                            .oneshot(request(client, key, payload, outcome, 0))
                            .await
                            .unwrap();
                        Got::read(response).await
                    });
                    match call.await {
                        Ok(got) => Some(got),
                        Err(err) if err.is_panic() => None,
                        Err(err) => panic!("{err}"),
                    }
                });
                match (got, &expected) {
                    (Some(got), _) => sut.check(&got, expected.as_ref()),
                    (None, Some((_, Expect::Runs(_, reply)))) if reply.status == 0 => {
                        sut.check_runs()
                    }
                    (None, _) => sut.fail(format!("the call panicked; expected {expected:?}")),
                }
            }
            Op::Duplicates {
                client,
                key,
                payload,
                n,
            } => sut.duplicates(client, key, payload, n),
            Op::HangUp {
                client,
                key,
                payload,
            } => sut.hang_up(client, key, payload),
        }
        // Every key the layers wrote has a TTL.
        sut.world.sweep();
        sut
    }
}

fn outcome_header(outcome: Outcome) -> String {
    format!("{outcome:?}")
}

fn request(client: u8, key: u8, payload: u8, outcome: Outcome, delay_ms: u64) -> Request<Body> {
    Request::post("/orders")
        .header("x-client", format!("c{client}"))
        .header("idempotency-key", format!("k{key}"))
        .header("x-outcome", outcome_header(outcome))
        .header("x-delay-ms", delay_ms.to_string())
        .body(Body::from(vec![b'p', payload]))
        .unwrap()
}

/// The fixture handler: does what `x-outcome` says, as `handler_reply` describes it.
async fn handler(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let run = shared.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let payload = body[1];
    let delay: u64 = headers["x-delay-ms"].to_str().unwrap().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let named = headers["x-outcome"].to_str().unwrap().to_owned();
    let outcome = OUTCOMES
        .iter()
        .copied()
        .find(|o| outcome_header(*o) == named)
        .unwrap();
    if outcome == Outcome::Panics {
        panic!("the handler panics (an expected part of the HTTP model test)");
    }
    if outcome == Outcome::LockBusy {
        return match redguard::lock("busy")
            .wait(Duration::from_millis(10))
            .acquire()
            .await
        {
            Ok(_) => panic!("the busy lock was free"),
            Err(err) => err.into_response(),
        };
    }
    let reply = handler_reply(outcome, payload, run);
    let bytes = reply.body.clone().unwrap();
    let body = if outcome == Outcome::Streamed {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            bytes.chunks(7).map(|c| Ok(c.to_vec())).collect();
        Body::from_stream(futures_util::stream::iter(chunks))
    } else {
        Body::from(bytes)
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap();
    for (name, values) in &reply.headers {
        for value in values {
            response.headers_mut().append(
                HeaderName::try_from(name.as_str()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
    }
    if outcome == Outcome::Shed {
        response.extensions_mut().insert(ErrorClass::Business);
    }
    response
}

const OUTCOMES: [Outcome; 11] = [
    Outcome::Created,
    Outcome::Rejected(400),
    Outcome::Rejected(404),
    Outcome::Rejected(409),
    Outcome::ServerError(500),
    Outcome::ServerError(502),
    Outcome::Shed,
    Outcome::LockBusy,
    Outcome::Streamed,
    Outcome::TooLarge,
    Outcome::Panics,
];

/// A response as read by the client.
#[derive(Debug)]
struct Got {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Got {
    async fn read(response: Response) -> Got {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        Got {
            status,
            headers,
            body,
        }
    }

    fn code(&self) -> Option<String> {
        let json: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        Some(json["error"].as_str()?.to_owned())
    }

    /// Whether it is `reply`, with `remaining` in its `RateLimit`; else why not.
    fn matches(&self, reply: &Reply, remaining: u64) -> Result<(), String> {
        if self.status != reply.status {
            return Err(format!("status {} (model {})", self.status, reply.status));
        }
        if let Some(code) = &reply.code
            && self.code().as_ref() != Some(code)
        {
            return Err(format!("code {:?} (model {code})", self.code()));
        }
        if let Some(body) = &reply.body
            && &self.body != body
        {
            return Err(format!("body {:?} (model {body:?})", self.body));
        }
        for name in CHECKED {
            let Some(expected) = reply.headers.get(name) else {
                continue;
            };
            let got: Vec<Vec<u8>> = self
                .headers
                .get_all(name)
                .iter()
                .map(|v| v.as_bytes().to_vec())
                .collect();
            if &got != expected {
                return Err(format!("{name}: {got:?} (model {expected:?})"));
            }
        }
        let ratelimit = self.headers.get("ratelimit").map(HeaderValue::as_bytes);
        let wanted = format!(";r={remaining};");
        if !ratelimit.is_some_and(|v| String::from_utf8_lossy(v).contains(&wanted)) {
            return Err(format!("ratelimit {ratelimit:?} (model r={remaining})"));
        }
        Ok(())
    }

    fn is_limited(&self) -> Result<(), String> {
        if self.status == 429
            && self.code().as_deref() == Some("rate_limited")
            && self.headers.contains_key("retry-after")
        {
            Ok(())
        } else {
            Err(format!(
                "{} {:?} (model 429 rate_limited)",
                self.status,
                self.code()
            ))
        }
    }
}

impl Sut {
    fn fail(&self, what: impl fmt::Debug) -> ! {
        panic!("{}", disagreement(&self.log, what));
    }

    fn check(&self, got: &Got, expected: Option<&(u64, Expect)>) {
        let verdict = match expected {
            None => got.is_limited(),
            Some((remaining, Expect::Answer(reply) | Expect::Runs(_, reply))) => {
                got.matches(reply, *remaining)
            }
        };
        if let Err(why) = verdict {
            self.fail(format!("{why}; expected {expected:?}; got {got:?}"));
        }
        if self.shared.runs.load(Ordering::SeqCst) != self.model.runs {
            self.fail(format!(
                "the handler ran {} times (model {})",
                self.shared.runs.load(Ordering::SeqCst),
                self.model.runs
            ));
        }
    }

    /// `n` at once: the first admitted one the model runs, every other one either a `409`
    /// (it came while the first ran) or the first's replay (it came after).
    fn duplicates(&mut self, client: u8, key: u8, payload: u8, n: usize) {
        let app = self.app.clone();
        let got: Vec<Got> = self.world.block_on(async move {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let app = app.clone();
                    tokio::spawn(async move {
                        let request = request(client, key, payload, Outcome::Created, 150);
                        Got::read(app.oneshot(request).await.unwrap()).await
                    })
                })
                .collect();
            let mut got = Vec::new();
            for task in tasks {
                got.push(task.await.unwrap());
            }
            got
        });
        let mut admitted = Vec::new();
        for _ in 0..n {
            if let Some(remaining) = self.model.admit(client) {
                admitted.push(remaining);
            }
        }
        let limited = got.iter().filter(|g| g.status == 429).count();
        if limited != n - admitted.len() {
            self.fail(format!(
                "{limited} of {n} limited (model {})",
                n - admitted.len()
            ));
        }
        let Some(_) = admitted.first() else {
            return;
        };
        let first = self.model.request(key, payload, Outcome::Created);
        let in_progress = refusal(409, "in_progress");
        let replay = match self.model.records.get(&key) {
            Some(Record::Success { reply, .. }) => Some(replay_of(reply)),
            _ => None,
        };
        let mut ran = 0;
        for got in got.iter().filter(|g| g.status != 429) {
            // The RateLimit remaining depends on the arrival order: any admitted one's.
            let fits = |reply: &Reply| admitted.iter().any(|r| got.matches(reply, *r).is_ok());
            let ok = match &first {
                Expect::Runs(_, live) if fits(live) => {
                    ran += 1;
                    true
                }
                Expect::Runs(..) => fits(&in_progress) || replay.as_ref().is_some_and(&fits),
                Expect::Answer(reply) => fits(reply),
            };
            if !ok {
                self.fail(format!("duplicate got {got:?}; model {first:?}"));
            }
        }
        if matches!(first, Expect::Runs(..)) && ran != 1 {
            self.fail(format!("{ran} duplicates got the live response (model 1)"));
        }
        self.check_runs();
    }

    /// The handler starts, the client hangs up: the handler finishes and is recorded.
    fn hang_up(&mut self, client: u8, key: u8, payload: u8) {
        let Some(remaining) = self.model.admit(client) else {
            let app = self.app.clone();
            let request = request(client, key, payload, Outcome::Created, 0);
            let got = self
                .world
                .block_on(async move { Got::read(app.oneshot(request).await.unwrap()).await });
            return self.check(&got, None);
        };
        let runs_before = self.model.runs;
        let expected = self.model.request(key, payload, Outcome::Created);
        let app = self.app.clone();
        let shared = Arc::clone(&self.shared);
        let admin = Admin::new(self.world.rg.clone());
        let record = admin
            .key(GuardKind::Idempotency, "http", &format!("k{key}"))
            .unwrap();
        let runs = matches!(expected, Expect::Runs(..));
        let got = self.world.block_on(async move {
            let request = request(client, key, payload, Outcome::Created, 100);
            let call =
                tokio::spawn(async move { Got::read(app.oneshot(request).await.unwrap()).await });
            if !runs {
                return Some(call.await.unwrap());
            }
            let started = async {
                while shared.runs.load(Ordering::SeqCst) == runs_before {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            };
            let mut call = call;
            tokio::select! {
                // Answered without running the handler: compared with the model below.
                answered = &mut call => return Some(answered.unwrap()),
                started = tokio::time::timeout(Duration::from_secs(10), started) => {
                    started.expect("the handler never started");
                }
            }
            call.abort();
            // Detached: the run goes on and records its result.
            let recorded = async {
                loop {
                    let inspection = admin.inspect(&record).await.unwrap();
                    if inspection.record.is_some_and(|r| r.status != "processing") {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), recorded)
                .await
                .expect("the abandoned run was never recorded");
            None
        });
        if let Some(got) = got {
            let expected = Some((remaining, expected));
            self.check(&got, expected.as_ref());
        }
        self.check_runs();
    }

    fn check_runs(&self) {
        let runs = self.shared.runs.load(Ordering::SeqCst);
        if runs != self.model.runs {
            self.fail(format!(
                "the handler ran {runs} times (model {})",
                self.model.runs
            ));
        }
    }
}
