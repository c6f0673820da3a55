//! README's curl session: each `$ ` command with the output README shows under it, and the
//! comparison of a real output with it.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

/// JSON fields whose values change from run to run: matched as "a value of the same type,
/// the same wherever README shows the same one".
const VOLATILE: [&str; 1] = ["fence"];

/// The session, in order.
pub(crate) struct Session {
    steps: Vec<Step>,
}

/// One command and the output README shows for it.
struct Step {
    /// As written, continuation lines (`\` + newline) included: `sh` joins them.
    command: String,
    expected: Vec<String>,
}

impl Session {
    /// Reads a `console` block: `$ ` starts a command (continued while a line ends with `\`),
    /// other lines are its output.
    pub(crate) fn parse(text: &str) -> Session {
        let mut steps: Vec<Step> = Vec::new();
        let mut continued = false;
        for line in text.lines() {
            match (steps.last_mut(), line.strip_prefix("$ ")) {
                (Some(step), _) if continued => {
                    step.command.push('\n');
                    step.command.push_str(line);
                }
                (_, Some(command)) => steps.push(Step {
                    command: command.to_owned(),
                    expected: Vec::new(),
                }),
                (Some(step), None) => step.expected.push(line.to_owned()),
                (None, None) => panic!("README's session starts with output: {line}"),
            }
            continued = line.ends_with('\\');
        }
        Session { steps }
    }

    /// The port the session's commands talk to (`localhost:<port>`).
    pub(crate) fn port(&self) -> u16 {
        let command = &self.steps.first().expect("an empty session").command;
        let after = command
            .split("localhost:")
            .nth(1)
            .expect("the session's first command names localhost:<port>");
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().expect("a port after localhost:")
    }

    /// Runs each command through `run` (its output) and compares; the differences, each
    /// naming its command.
    pub(crate) fn replay(&self, mut run: impl FnMut(&str) -> String) -> Vec<String> {
        let expected: Vec<Response> = self
            .steps
            .iter()
            .map(|step| Response::from_readme(&step.expected))
            .collect();
        // Headers README shows somewhere: present where shown, absent elsewhere.
        let shown: BTreeSet<String> = expected
            .iter()
            .flat_map(|r| r.headers.iter().map(|(name, _)| name.clone()))
            .collect();
        let mut volatile = HashMap::new();
        let mut mismatches = Vec::new();
        for (step, expected) in self.steps.iter().zip(&expected) {
            let output = run(&step.command);
            let actual = Response::from_output(&output);
            for why in expected.differences(&actual, &shown, &mut volatile) {
                mismatches.push(format!(
                    "$ {}\n  {why}\n  README:\n    {}\n  got:\n    {}",
                    step.command,
                    step.expected.join("\n    "),
                    output.replace("\r\n", "\n").replace('\n', "\n    ")
                ));
            }
        }
        mismatches
    }
}

/// An HTTP response as curl prints it: with `-i` a status line and headers, then the body.
struct Response {
    status: Option<String>,
    /// Names lowercased.
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    /// From README: the status line, the headers it chose to show, the body.
    fn from_readme(lines: &[String]) -> Response {
        let mut lines = lines.iter().map(String::as_str).peekable();
        let status = lines
            .next_if(|line| line.starts_with("HTTP/"))
            .map(str::to_owned);
        let mut headers = Vec::new();
        if status.is_some() {
            while let Some(header) = lines.next_if(|line| !line.starts_with(['{', '['])) {
                headers.push(header_line(header).expect("a header line in README"));
            }
        }
        Response {
            status,
            headers,
            body: lines.collect::<Vec<_>>().join("\n"),
        }
    }

    /// From curl's output.
    fn from_output(output: &str) -> Response {
        let output = output.replace("\r\n", "\n");
        if !output.starts_with("HTTP/") {
            return Response {
                status: None,
                headers: Vec::new(),
                body: output,
            };
        }
        let (head, body) = output.split_once("\n\n").unwrap_or((&output, ""));
        let mut head = head.lines();
        Response {
            status: head.next().map(|line| line.trim().to_owned()),
            headers: head.filter_map(header_line).collect(),
            body: body.to_owned(),
        }
    }

    /// How `actual` differs from this README response.
    fn differences(
        &self,
        actual: &Response,
        shown: &BTreeSet<String>,
        volatile: &mut HashMap<String, Value>,
    ) -> Vec<String> {
        let mut why = Vec::new();
        if self.status != actual.status {
            why.push(format!(
                "status {:?}, README {:?}",
                actual.status, self.status
            ));
        }
        for (name, value) in &self.headers {
            let got = actual.header(name);
            if got != Some(value.as_str()) {
                why.push(format!("header {name}: {got:?}, README {value:?}"));
            }
        }
        for name in shown {
            let here = self.headers.iter().any(|(shown, _)| shown == name);
            if !here && let Some(value) = actual.header(name) {
                why.push(format!(
                    "header {name}: {value:?}, which README does not show here"
                ));
            }
        }
        let same_body = match (
            serde_json::from_str::<Value>(&self.body),
            serde_json::from_str::<Value>(&actual.body),
        ) {
            (Ok(readme), Ok(got)) => matches(&readme, &got, None, volatile),
            _ => self.body.trim() == actual.body.trim(),
        };
        if !same_body {
            why.push("a different body".to_owned());
        }
        why
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(have, _)| have == name)
            .map(|(_, value)| value.as_str())
    }
}

fn header_line(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once(':')?;
    Some((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
}

/// Whether `got` is `readme`, volatile fields aside: those must hold a value of the same
/// type, the same one wherever README repeats the value.
fn matches(
    readme: &Value,
    got: &Value,
    field: Option<&str>,
    volatile: &mut HashMap<String, Value>,
) -> bool {
    if field.is_some_and(|field| VOLATILE.contains(&field)) {
        let same_type = std::mem::discriminant(readme) == std::mem::discriminant(got);
        let bound = volatile
            .entry(readme.to_string())
            .or_insert_with(|| got.clone());
        return same_type && bound == got;
    }
    match (readme, got) {
        (Value::Object(readme), Value::Object(got)) => {
            readme.len() == got.len()
                && readme.iter().all(|(key, value)| {
                    got.get(key)
                        .is_some_and(|have| matches(value, have, Some(key), volatile))
                })
        }
        (Value::Array(readme), Value::Array(got)) => {
            readme.len() == got.len()
                && readme
                    .iter()
                    .zip(got)
                    .all(|(value, have)| matches(value, have, None, volatile))
        }
        _ => readme == got,
    }
}
