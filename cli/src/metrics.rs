//! Reading a service's Prometheus endpoint: one bounded GET (reqwest) and the `redguard_*`
//! samples of the text exposition format.

use std::time::Duration;

use serde::Serialize;

/// The largest page read: a service's `/metrics` is kilobytes; anything near this is not one.
pub(crate) const MAX_PAGE: usize = 16 * 1024 * 1024;

/// The whole request, connecting included.
const TIMEOUT: Duration = Duration::from_secs(5);

/// One sample of a redguard metric.
#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct Sample {
    pub(crate) name: String,
    /// The label set as written between the braces (`scope="shop",guard="lock"`).
    pub(crate) labels: String,
    pub(crate) value: String,
}

/// The `redguard_*` samples at `url` (`http://host:port/path`).
pub(crate) async fn fetch(url: &str) -> Result<Vec<Sample>, crate::Failure> {
    if !url.starts_with("http://") {
        return Err("--metrics-url must be an http:// URL".into());
    }
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .build()?;
    let failed = |err: reqwest::Error| {
        if err.is_timeout() {
            format!("{url}: no answer within {} s", TIMEOUT.as_secs())
        } else {
            // Without the URL: reqwest's message already names it.
            format!("reading metrics: {err}")
        }
    };
    let mut response = client.get(url).send().await.map_err(failed)?;
    if response.status() != reqwest::StatusCode::OK {
        return Err(format!("{url}: HTTP {}", response.status()).into());
    }
    let too_large = || format!("{url}: the page is larger than {} MiB", MAX_PAGE >> 20);
    if response
        .content_length()
        .is_some_and(|length| length > MAX_PAGE as u64)
    {
        return Err(too_large().into());
    }
    let mut page = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if page.len() + chunk.len() > MAX_PAGE {
            return Err(too_large().into());
        }
        page.extend_from_slice(&chunk);
    }
    Ok(parse(&String::from_utf8_lossy(&page)))
}

/// The `redguard_*` samples of a Prometheus text exposition; lines that are not a
/// well-formed sample are skipped.
pub(crate) fn parse(page: &str) -> Vec<Sample> {
    page.lines()
        .filter(|line| line.starts_with("redguard_"))
        .filter_map(sample)
        .collect()
}

/// `name{label="value",...} value [timestamp]`, label values with `\\`, `\"` and `\n`
/// escapes (so a `}` or a space inside quotes is part of the value).
fn sample(line: &str) -> Option<Sample> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = "";
    if let Some(inner) = rest.strip_prefix('{') {
        let end = label_set_end(inner)?;
        labels = &inner[..end];
        rest = &inner[end + 1..];
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next()?;
    value.parse::<f64>().ok()?;
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<i64>().ok()?;
    }
    if fields.next().is_some() || !rest.starts_with([' ', '\t']) {
        return None;
    }
    Some(Sample {
        name: name.to_owned(),
        labels: labels.to_owned(),
        value: value.to_owned(),
    })
}

/// Where the `}` closing a label set is in `inner` (the text after `{`).
fn label_set_end(inner: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (at, c) in inner.char_indices() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => quoted = !quoted,
            (false, _, '}') => return Some(at),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> Option<(String, String, String)> {
        sample(line).map(|s| (s.name, s.labels, s.value))
    }

    #[test]
    fn samples() {
        let page = "# HELP redguard_x x\nredguard_x{guard=\"lock\"} 3\nother 1\nredguard_y 2\n";
        let samples = parse(page);
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].labels, "guard=\"lock\"");
        assert_eq!(samples[1].value, "2");
    }

    #[test]
    fn label_values_and_timestamps() {
        let own = |s: &str| s.to_owned();
        assert_eq!(
            one(r#"redguard_a{scope="x} y",k="a\"b"} 1.5 1700000000000"#),
            Some((
                own("redguard_a"),
                own(r#"scope="x} y",k="a\"b""#),
                own("1.5")
            ))
        );
        assert_eq!(
            one("redguard_b +Inf"),
            Some((own("redguard_b"), own(""), own("+Inf")))
        );
        for bad in [
            "redguard_c",
            "redguard_c{scope=\"x\" 1",
            "redguard_c{} one",
            "redguard_c 1 2 3",
            "redguard_c1",
            "redguard_c 1 now",
        ] {
            assert_eq!(one(bad), None, "{bad}");
        }
    }

    /// Serves `head` then `pieces` (each written and flushed on its own) to one request.
    async fn serve(head: Vec<u8>, pieces: Vec<Vec<u8>>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let _ = socket.write_all(&head).await;
            for piece in pieces {
                if socket.write_all(&piece).await.is_err() {
                    return;
                }
                let _ = socket.flush().await;
            }
        });
        url
    }

    /// `body` in chunked encoding, cut at `cuts` (byte offsets, anywhere: inside characters).
    fn chunked(body: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.extend([0, body.len()]);
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = Vec::new();
        for pair in cuts.windows(2) {
            let chunk = &body[pair[0]..pair[1]];
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    fn runner() -> proptest::test_runner::TestRunner {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(128);
        proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases,
            failure_persistence: None,
            ..Default::default()
        })
    }

    /// A page of redguard samples, other lines and arbitrary bytes.
    fn page() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let line = prop_oneof![
            Just(b"redguard_lock_acquired_total{scope=\"caf\xc3\xa9\"} 7\n".to_vec()),
            Just(b"redguard_x{a=\"}\\\" {\",b=\"\\n\"} -1.5e3 1700000000000\n".to_vec()),
            Just(b"# HELP redguard_x \xe2\x9c\x93 help\n# TYPE redguard_x counter\n".to_vec()),
            Just(b"process_cpu_seconds_total 1\n".to_vec()),
            "[^\u{0}]{0,60}\n?".prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..60),
        ];
        prop::collection::vec(line, 0..30).prop_map(|lines| lines.concat())
    }

    #[test]
    fn any_text_parses_without_a_panic() {
        use proptest::prelude::*;
        let result = runner().run(&"\\PC{0,400}", |text| {
            for sample in parse(&text) {
                prop_assert!(sample.name.starts_with("redguard_"), "{sample:?}");
                prop_assert!(sample.value.parse::<f64>().is_ok(), "{sample:?}");
            }
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }

    /// Any page, cut into chunks anywhere (inside characters too), reads as the same samples
    /// as the whole page; the hand-written decoder this replaced panicked on a cut inside a
    /// character.
    #[test]
    fn chunk_boundaries_anywhere() {
        use proptest::prelude::*;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cuts = prop::collection::vec(any::<usize>(), 0..12);
        let result = runner().run(&(page(), cuts), |(body, cuts)| {
            let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            let pieces: Vec<Vec<u8>> = chunked(&body, &cuts)
                .chunks(7)
                .map(<[u8]>::to_vec)
                .collect();
            let read = rt.block_on(async { fetch(&serve(head, pieces).await).await });
            let read = read.map_err(|err| TestCaseError::fail(err.to_string()))?;
            prop_assert_eq!(read, parse(&String::from_utf8_lossy(&body)));
            Ok(())
        });
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }

    /// A page over the cap is refused with a clear error, announced or streamed.
    #[tokio::test]
    async fn a_huge_page_is_refused() {
        let announced = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
            MAX_PAGE + 1
        );
        let url = serve(announced.into_bytes(), vec![b"redguard_x 1\n".to_vec()]).await;
        let err = fetch(&url).await.unwrap_err().to_string();
        assert!(err.contains("larger than 16 MiB"), "{err}");

        let line = b"redguard_x{scope=\"s\"} 1\n".repeat(64 * 1024);
        let pieces = vec![chunked(&line, &[]); MAX_PAGE / line.len() + 2];
        let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        // Each piece is a whole chunked body: the first ends the page for a decoder that
        // stops at the zero chunk, so stream them as one long chunk sequence instead.
        let stream: Vec<Vec<u8>> = pieces
            .into_iter()
            .map(|mut piece| {
                piece.truncate(piece.len() - 5);
                piece
            })
            .collect();
        let url = serve(head, stream).await;
        let err = fetch(&url).await.unwrap_err().to_string();
        assert!(err.contains("larger than 16 MiB"), "{err}");
    }
}
