//! The HTTP contract of `RateLimitLayer` around `IdempotencyLayer`, as the guide ("Web") and the
//! layers' docs state it: which status, code and headers each request gets, which bytes a
//! replay carries, and what each handler outcome leaves in the record.
//!
//! The handler's responses are described by [`Outcome`]; the model knows every header and
//! byte the handler sends (its run number included), so a response is predicted exactly.

use std::collections::BTreeMap;

/// What the handler does on a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `201` with the full header set and a binary body within `max_response`.
    Created,
    /// A business `4xx` (the status).
    Rejected(u16),
    /// A `5xx` without a class (the status).
    ServerError(u16),
    /// A `503` the handler marks `ErrorClass::Business`.
    Shed,
    /// A lock that stays busy: `redguard::Error::LockTimeout`, `503 busy`.
    LockBusy,
    /// A `200` whose body streams (no declared length).
    Streamed,
    /// A `200` whose body declares more than `max_response`.
    TooLarge,
    /// The handler panics: the panic reaches the server (no response); the outcome is
    /// unknown.
    Panics,
}

/// A record as the layer leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A recorded success: what a replay sends.
    Success { fingerprint: u8, reply: Reply },
    /// An unknown outcome: retries are refused until an operator resolves it.
    Unknown { fingerprint: u8 },
    /// A business failure: released, a retry runs, with this payload or a corrected one.
    Released,
}

/// A response, as far as the contract fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// `error` of a JSON body the layers answered themselves.
    pub code: Option<String>,
    /// Every header the contract fixes, in order per name; names the contract says are
    /// absent map to an empty list.
    pub headers: BTreeMap<String, Vec<Vec<u8>>>,
    /// `None`: a layer's own JSON body (its `code` is checked instead).
    pub body: Option<Vec<u8>>,
}

/// The header names compared on every response.
pub const CHECKED: [&str; 8] = [
    "set-cookie",
    "cache-control",
    "link",
    "content-disposition",
    "location",
    "x-run",
    "idempotent-replayed",
    "retry-after",
];

/// The headers a replay carries (the layer's `replay_headers` in these tests).
pub const REPLAYED: [&str; 4] = ["content-type", "location", "link", "content-disposition"];

/// `attachment; filename="thé €.bin"` in UTF-8: obs-text in a field value.
pub const DISPOSITION: &[u8] = "attachment; filename=\"th\u{e9} \u{20ac}.bin\"".as_bytes();

/// Requests a client may make per window (`RateLimitLayer`, limit `client`).
pub const QUOTA: u64 = 8;
/// The largest response recorded.
pub const MAX_RESPONSE: usize = 256;

/// The body of run `run` for payload `payload`: binary (a NUL, bytes over 0x7f, not UTF-8).
pub fn body(outcome: Outcome, payload: u8, run: u64) -> Vec<u8> {
    let mut body = vec![0, payload, 0xff, 0xfe, b'r'];
    body.extend_from_slice(&run.to_be_bytes());
    match outcome {
        Outcome::Streamed => body.repeat(3),
        Outcome::TooLarge => body.repeat(MAX_RESPONSE / body.len() + 2),
        _ => body,
    }
}

/// What the handler answers (for outcomes it answers itself).
pub fn handler_reply(outcome: Outcome, payload: u8, run: u64) -> Reply {
    let mut headers = absent();
    let status = match outcome {
        Outcome::Created | Outcome::Streamed | Outcome::TooLarge => {
            headers.insert("set-cookie".into(), vec![b"session=run".to_vec()]);
            headers.insert("cache-control".into(), vec![b"no-store".to_vec()]);
            headers.insert(
                "link".into(),
                vec![b"</a>; rel=first".to_vec(), b"</b>; rel=second".to_vec()],
            );
            headers.insert("content-disposition".into(), vec![DISPOSITION.to_vec()]);
            headers.insert(
                "location".into(),
                vec![format!("/orders/{run}").into_bytes()],
            );
            if outcome == Outcome::Created {
                201
            } else {
                200
            }
        }
        Outcome::Rejected(status) | Outcome::ServerError(status) => status,
        Outcome::Shed => 503,
        // No response at all: status 0 marks it.
        Outcome::Panics => return refusal(0, "panic"),
        Outcome::LockBusy => {
            headers.insert("retry-after".into(), vec![b"1".to_vec()]);
            return Reply {
                status: 503,
                code: Some("busy".into()),
                headers,
                body: None,
            };
        }
    };
    headers.insert("x-run".into(), vec![run.to_string().into_bytes()]);
    Reply {
        status,
        code: None,
        headers,
        body: Some(body(outcome, payload, run)),
    }
}

fn absent() -> BTreeMap<String, Vec<Vec<u8>>> {
    CHECKED
        .iter()
        .map(|name| ((*name).to_owned(), Vec::new()))
        .collect()
}

/// A response the layers answered themselves (its `Retry-After` is the status table's, not
/// checked here).
pub fn refusal(status: u16, code: &str) -> Reply {
    let mut headers = absent();
    headers.remove("retry-after");
    Reply {
        status,
        code: Some(code.to_owned()),
        headers,
        body: None,
    }
}

/// The replay of a recorded `reply`: its status and body, the replayed headers only.
pub fn replay_of(reply: &Reply) -> Reply {
    let mut headers = absent();
    for name in REPLAYED {
        if let Some(values) = reply.headers.get(name) {
            headers.insert(name.to_owned(), values.clone());
        }
    }
    headers.insert("idempotent-replayed".into(), vec![b"true".to_vec()]);
    Reply {
        status: reply.status,
        code: None,
        headers,
        body: reply.body.clone(),
    }
}

/// What an admitted request gets, and whether the handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The layer answers without running the handler.
    Answer(Reply),
    /// The handler runs (its run number) and its response is sent as it is.
    Runs(u64, Reply),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpModel {
    /// Requests admitted per client.
    pub admitted: BTreeMap<u8, u64>,
    pub records: BTreeMap<u8, Record>,
    /// Handler runs so far.
    pub runs: u64,
}

impl HttpModel {
    /// The rate limit's decision for `client`: the `RateLimit` remaining after it, or `None`
    /// for a `429`.
    pub fn admit(&mut self, client: u8) -> Option<u64> {
        let used = self.admitted.entry(client).or_default();
        if *used >= QUOTA {
            return None;
        }
        *used += 1;
        Some(QUOTA - *used)
    }

    /// A request with `key` and `payload` whose handler would do `outcome`, once admitted.
    pub fn request(&mut self, key: u8, payload: u8, outcome: Outcome) -> Expect {
        match self.records.get(&key) {
            Some(Record::Success { fingerprint, .. } | Record::Unknown { fingerprint })
                if *fingerprint != payload =>
            {
                return Expect::Answer(refusal(422, "key_reuse"));
            }
            Some(Record::Success { reply, .. }) => return Expect::Answer(replay_of(reply)),
            Some(Record::Unknown { .. }) => return Expect::Answer(refusal(409, "outcome_unknown")),
            Some(Record::Released) | None => {}
        }
        self.runs += 1;
        let run = self.runs;
        let reply = handler_reply(outcome, payload, run);
        let record = match outcome {
            Outcome::Created => Record::Success {
                fingerprint: payload,
                reply: reply.clone(),
            },
            Outcome::Rejected(_) | Outcome::Shed | Outcome::LockBusy => Record::Released,
            Outcome::ServerError(_) | Outcome::Streamed | Outcome::TooLarge | Outcome::Panics => {
                Record::Unknown {
                    fingerprint: payload,
                }
            }
        };
        self.records.insert(key, record);
        Expect::Runs(run, reply)
    }
}
