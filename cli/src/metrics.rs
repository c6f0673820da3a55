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
}
