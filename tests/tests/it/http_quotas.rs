//! Quotas per tenant on `RateLimitLayer` (issue 28): a policy's rate and burst resolved from
//! each request (a plan looked up from the request), exact per plan, all-or-nothing with the
//! layer's other policies; a tenant changing plan keeps its state in units; a request with no
//! plan is a `500` that charges nothing; shadow policies admit what they would refuse while the
//! enforced ones are still charged.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use redguard::Redguard;
use redguard::admin::{Admin, Quota, QuotaTtl};
use redguard::http::{HeaderKey, Policy, RateLimitLayer};
use tower::ServiceExt as _;

redguard_tests::conformance!(
    each_tenant_is_limited_by_its_plan,
    a_tenant_changing_plan_keeps_what_it_used,
    a_request_without_a_plan_is_refused_and_charges_nothing,
    a_shadow_policy_admits_and_the_enforced_one_is_charged,
    an_operators_override_takes_precedence_over_the_plan,
);

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

fn tenant(id: &str) -> Request<Body> {
    Request::get("/")
        .header("x-tenant", id)
        .body(Body::empty())
        .unwrap()
}

/// Plans by tenant, changeable while the layer runs (what a billing system's cache does).
type Plans = Arc<Mutex<HashMap<String, Quota>>>;

fn plans(entries: &[(&str, &str)]) -> Plans {
    Arc::new(Mutex::new(
        entries
            .iter()
            .map(|(tenant, rate)| ((*tenant).to_owned(), Quota::new(*rate, None).unwrap()))
            .collect(),
    ))
}

fn layer(rg: &Redguard, scope: &str, plans: &Plans) -> RateLimitLayer<HeaderKey> {
    let plans = plans.clone();
    RateLimitLayer::builder(HeaderKey::new("x-tenant").unwrap())
        .policy(Policy::per_request("plan", move |_parts, key| {
            plans.lock().unwrap().get(key).copied()
        }))
        .scope(scope)
        .on(rg)
        .build()
        .unwrap()
}

/// Admitted requests of `id` among `n` sent one after another.
async fn admitted(app: &Router, id: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let response = app.clone().oneshot(tenant(id)).await.unwrap();
        match response.status() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("tenant {id}: unexpected {other}"),
        }
    }
    admitted
}

async fn each_tenant_is_limited_by_its_plan(rg: Redguard) {
    let plans = plans(&[("acme", "3/h"), ("globex", "7/h"), ("initech", "1/h")]);
    let app = hello().layer(layer(&rg, "plans", &plans));
    let first = app.clone().oneshot(tenant("globex")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The plan's quota, not a literal's (the window is the burst's refill time, GCRA-rounded).
    let policy = first.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(policy.starts_with("\"plan\";q=7;w=360"), "{policy}");
    assert_eq!(admitted(&app, "globex", 10).await, 6);
    assert_eq!(admitted(&app, "acme", 10).await, 3);
    assert_eq!(admitted(&app, "initech", 10).await, 1);
    // Concurrent requests of one tenant: still exactly its plan.
    let plans = plans_with(&plans, "umbrella", "5/h");
    let app = hello().layer(layer(&rg, "plans", &plans));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(tenant("umbrella")).await.unwrap().status() })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += usize::from(task.await.unwrap() == StatusCode::OK);
    }
    assert_eq!(ok, 5);
}

fn plans_with(plans: &Plans, id: &str, rate: &str) -> Plans {
    plans
        .lock()
        .unwrap()
        .insert(id.to_owned(), Quota::new(rate, None).unwrap());
    plans.clone()
}

/// The state is kept in units: what a tenant used on its old plan counts against the new one.
async fn a_tenant_changing_plan_keeps_what_it_used(rg: Redguard) {
    let plans = plans(&[("acme", "10/h")]);
    let app = hello().layer(layer(&rg, "plans.change", &plans));
    assert_eq!(admitted(&app, "acme", 4).await, 4);
    // Down to 6/h: 2 more, not 6.
    plans_with(&plans, "acme", "6/h");
    assert_eq!(admitted(&app, "acme", 10).await, 2);
    // Up to 20/h: the 6 used leave 14.
    plans_with(&plans, "acme", "20/h");
    assert_eq!(admitted(&app, "acme", 30).await, 14);
}

async fn a_request_without_a_plan_is_refused_and_charges_nothing(rg: Redguard) {
    let plans = plans(&[("acme", "5/h")]);
    let resolver = plans.clone();
    let app = hello().layer(
        RateLimitLayer::builder(HeaderKey::new("x-tenant").unwrap())
            .policy(Policy::new("api", "3/h").global())
            .policy(Policy::per_request("plan", move |_parts, key| {
                resolver.lock().unwrap().get(key).copied()
            }))
            .scope("plans.missing")
            .on(&rg)
            .build()
            .unwrap(),
    );
    for _ in 0..5 {
        let unknown = app.clone().oneshot(tenant("nobody")).await.unwrap();
        assert_eq!(unknown.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    // The global policy was never charged by them: its 3 are all there.
    assert_eq!(admitted(&app, "acme", 5).await, 3);
}

async fn a_shadow_policy_admits_and_the_enforced_one_is_charged(rg: Redguard) {
    let app = |shadow: bool| {
        hello().layer(
            RateLimitLayer::builder(HeaderKey::new("x-tenant").unwrap())
                .policy(Policy::new("api", "2/h").global().shadow(shadow))
                .policy(Policy::new("tenant", "4/h"))
                .scope("plans.shadow")
                .on(&rg)
                .build()
                .unwrap(),
        )
    };
    let dry_run = app(true);
    // The shadow policy would refuse from the third; the tenant policy refuses from the fifth.
    assert_eq!(admitted(&dry_run, "acme", 6).await, 4);
    // Counted as if enforced: enforcing it now refuses every tenant.
    let enforced = app(false);
    assert_eq!(admitted(&enforced, "globex", 3).await, 0);
    assert_eq!(admitted(&dry_run, "globex", 6).await, 4);
}

#[test]
fn a_per_request_policy_takes_no_literal_burst() {
    let err = RateLimitLayer::builder(HeaderKey::new("x-tenant").unwrap())
        .policy(Policy::per_request("plan", |_, _| Quota::new("1/s", None).ok()).burst(5))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("plan's `Quota`"), "{err}");
}

/// The layer's keys are `<scope>.<policy>` and the extractor's key: an operator's override
/// there (an exact key, or off a Cluster a prefix) wins over the request's plan.
async fn an_operators_override_takes_precedence_over_the_plan(rg: Redguard) {
    let plans = plans(&[("acme", "2/h"), ("acorn", "2/h")]);
    let app = hello().layer(layer(&rg, "plans.ops", &plans));
    assert_eq!(admitted(&app, "acme", 1).await, 1);
    let admin = Admin::new(rg.clone());
    let hour = QuotaTtl::For(std::time::Duration::from_secs(3600));
    admin
        .quota_set(
            "plans.ops.plan",
            "acme",
            &Quota::new("6/h", None).unwrap(),
            hour,
        )
        .await
        .unwrap();
    // 1 used of the override's 6.
    assert_eq!(admitted(&app, "acme", 10).await, 5);
    assert_eq!(admitted(&app, "acorn", 10).await, 2);
    if rg.kind() != redguard::handle::StoreKind::Cluster {
        admin
            .quota_set(
                "plans.ops.plan",
                "ac*",
                &Quota::new("4/h", None).unwrap(),
                hour,
            )
            .await
            .unwrap();
        // acorn used 2 of the prefix's 4; acme keeps its exact override, all used.
        assert_eq!(admitted(&app, "acorn", 10).await, 2);
        assert_eq!(admitted(&app, "acme", 10).await, 0);
        admin.quota_clear("plans.ops.plan", "ac*").await.unwrap();
    }
    admin.quota_clear("plans.ops.plan", "acme").await.unwrap();
}
