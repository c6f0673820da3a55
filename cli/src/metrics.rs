//! Reading a service's Prometheus endpoint: a plain HTTP/1.1 GET, enough for `/metrics`.

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One sample of a redguard metric.
#[derive(Debug, Serialize)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: String,
    pub(crate) value: String,
}

/// The `redguard_*` samples at `url` (`http://host:port/path`).
pub(crate) async fn fetch(url: &str) -> Result<Vec<Sample>, crate::Failure> {
    let rest = url
        .strip_prefix("http://")
        .ok_or("--metrics-url must be an http:// URL")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .map_err(|_| format!("{url}: no answer within 5 s"))??;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{url}: not an HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("{url}: {status}").into());
    }
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(parse(&body))
}

/// A chunked body's data.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The `redguard_*` samples of a Prometheus text exposition.
fn parse(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|line| line.starts_with("redguard_"))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            Some(Sample {
                name: name.to_owned(),
                labels: labels.to_owned(),
                value: value.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_chunks() {
        let body = "# HELP redguard_x x\nredguard_x{guard=\"lock\"} 3\nother 1\nredguard_y 2\n";
        let samples = parse(body);
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].labels, "guard=\"lock\"");
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
