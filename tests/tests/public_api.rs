//! The public API of `redguard`, as a sorted list of items with their signatures, compared
//! with `runtime/public-api.txt`, so a change to the API is a deliberate diff in review.
//! The list comes from rustdoc's JSON output (`cargo rustdoc -- --output-format json`,
//! unstable, hence `RUSTC_BOOTSTRAP=redguard` on the pinned toolchain: for that crate only, so
//! no dependency's build script takes the compiler for a nightly), built with every feature a
//! user can turn on (not `test-util`), in a target dir of its own: `cargo test` holds the
//! lock of the one it runs from.
//!
//! Bless a deliberate change with
//! `UPDATE_PUBLIC_API=1 cargo test -p redguard-tests --test public_api`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The features a user can turn on; `test-util` is the test suite's, not an API.
const FEATURES: &str = "tls,cluster,sentinel,http,tower,axum,anyhow,testing,sqlx";

#[test]
fn the_public_api_is_the_committed_one() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let snapshot = workspace.join("runtime/public-api.txt");
    let current = render(&rustdoc_json(&workspace));
    if std::env::var_os("UPDATE_PUBLIC_API").is_some() {
        std::fs::write(&snapshot, &current).expect("write runtime/public-api.txt");
        return;
    }
    let committed = std::fs::read_to_string(&snapshot).unwrap_or_default();
    if committed != current {
        let (old, new): (BTreeSet<&str>, BTreeSet<&str>) =
            (committed.lines().collect(), current.lines().collect());
        let mut diff = String::new();
        for line in old.difference(&new) {
            diff.push_str(&format!("- {line}\n"));
        }
        for line in new.difference(&old) {
            diff.push_str(&format!("+ {line}\n"));
        }
        panic!(
            "the public API differs from runtime/public-api.txt:\n{diff}\nIf the change is \
             deliberate, bless it: UPDATE_PUBLIC_API=1 cargo test -p redguard-tests --test \
             public_api"
        );
    }
}

/// Runs rustdoc's JSON backend on `redguard` and parses what it wrote.
fn rustdoc_json(workspace: &Path) -> Value {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from)
        .join("public-api");
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // What cargo sets for this test process would reach the nested build's build scripts,
    // which watch some of it (ring's watches CARGO_MANIFEST_DIR) and would rebuild each time.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if set_by_cargo(&name) {
            cargo.env_remove(&*name);
        }
    }
    let output = cargo
        .current_dir(workspace)
        .env("RUSTC_BOOTSTRAP", "redguard")
        .env_remove("RUSTDOCFLAGS")
        .args([
            "rustdoc",
            "-p",
            "redguard",
            "--lib",
            "--locked",
            "--features",
            FEATURES,
        ])
        .arg("--target-dir")
        .arg(&target)
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        .output()
        .expect("run cargo rustdoc");
    assert!(
        output.status.success(),
        "cargo rustdoc failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json = std::fs::read_to_string(target.join("doc/redguard.json"))
        .expect("read rustdoc's redguard.json");
    serde_json::from_str(&json).expect("parse rustdoc's JSON")
}

/// What cargo sets for a test process that a shell does not have.
fn set_by_cargo(name: &str) -> bool {
    name == "OUT_DIR"
        || [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
            "CARGO_PRIMARY_",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || name == "CARGO_TARGET_TMPDIR"
}

/// One line per public item at each path it can be named by, and one per member (method,
/// field, variant, trait impl) under the shortest of them; sorted.
fn render(krate: &Value) -> String {
    let api = Api {
        index: &krate["index"],
        paths: &krate["paths"],
    };
    let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
    api.walk(
        &id(&krate["root"]),
        "redguard",
        &mut paths,
        &mut BTreeSet::new(),
    );
    let mut lines = BTreeSet::new();
    for (item, mut at) in paths {
        at.sort_by_key(|p| (p.matches("::").count(), p.clone()));
        for path in &at {
            lines.insert(api.line(&item, path));
        }
        api.members(&item, &at[0], &mut lines);
    }
    lines.into_iter().map(|l| l + "\n").collect()
}

fn id(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

struct Api<'a> {
    index: &'a Value,
    /// Every item rustdoc names, other crates' included: their kind and path.
    paths: &'a Value,
}

impl<'a> Api<'a> {
    fn item(&self, id: &str) -> Option<&'a Value> {
        self.index.get(id)
    }

    fn kind(item: &Value) -> &str {
        item["inner"]
            .as_object()
            .and_then(|o| o.keys().next())
            .map_or("?", String::as_str)
    }

    /// Records every public path below module `module`, reached as `path`.
    fn walk(
        &self,
        module: &str,
        path: &str,
        paths: &mut BTreeMap<String, Vec<String>>,
        seen: &mut BTreeSet<String>,
    ) {
        if !seen.insert(format!("{module}@{path}")) {
            return;
        }
        let Some(m) = self.item(module) else { return };
        for child in m["inner"]["module"]["items"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let child = id(child);
            let Some(item) = self.item(&child) else {
                continue;
            };
            if item["visibility"] != "public" {
                continue;
            }
            if let Some(u) = item["inner"].get("use") {
                let target = id(&u["id"]);
                let local = self.item(&target);
                if u["is_glob"] == true {
                    if local.is_some() {
                        self.walk(&target, path, paths, seen);
                    }
                    continue;
                }
                let name = u["name"].as_str().unwrap_or("?");
                let at = format!("{path}::{name}");
                match local {
                    Some(t) if Self::kind(t) == "module" => self.walk(&target, &at, paths, seen),
                    Some(_) => paths.entry(target).or_default().push(at),
                    // Another crate's item (the attribute macros, the grammar's bounds).
                    None => {
                        let summary = &self.paths[&target];
                        let source: Vec<&str> = summary["path"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        let kind = summary["kind"].as_str().unwrap_or("?");
                        let source = format!("use {kind} {}", source.join("::"));
                        paths.entry(source).or_default().push(at);
                    }
                }
                continue;
            }
            let name = item["name"].as_str().unwrap_or("?");
            let at = format!("{path}::{name}");
            if Self::kind(item) == "module" {
                paths.entry(child.clone()).or_default().push(at.clone());
                self.walk(&child, &at, paths, seen);
            } else {
                paths.entry(child).or_default().push(at);
            }
        }
    }

    fn line(&self, item: &str, path: &str) -> String {
        if let Some(source) = item.strip_prefix("use ") {
            let (kind, source) = source.split_once(' ').unwrap_or(("?", source));
            return format!("{kind} {path} (= {source})");
        }
        let Some(it) = self.item(item) else {
            return format!("? {path}");
        };
        let attrs = it["attrs"].to_string();
        let marks = if attrs.contains("non_exhaustive") {
            "#[non_exhaustive] "
        } else {
            ""
        };
        let inner = &it["inner"];
        match Self::kind(it) {
            "function" => format!("{marks}{}", self.function(path, &inner["function"])),
            "struct" => format!(
                "{marks}struct {path}{}",
                generics(&inner["struct"]["generics"])
            ),
            "enum" => format!("{marks}enum {path}{}", generics(&inner["enum"]["generics"])),
            "trait" => format!("trait {path}{}", generics(&inner["trait"]["generics"])),
            "constant" => format!("const {path}: {}", ty(&inner["constant"]["type"])),
            "static" => format!("static {path}: {}", ty(&inner["static"]["type"])),
            "type_alias" => format!("type {path} = {}", ty(&inner["type_alias"]["type"])),
            other => format!("{other} {path}"),
        }
    }

    fn function(&self, path: &str, f: &Value) -> String {
        let h = &f["header"];
        let mut s = String::new();
        for (flag, word) in [
            ("is_const", "const "),
            ("is_async", "async "),
            ("is_unsafe", "unsafe "),
        ] {
            if h[flag] == true {
                s.push_str(word);
            }
        }
        let inputs: Vec<String> = f["sig"]["inputs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| match p[0].as_str() {
                Some("self") => self_param(&p[1]),
                name => format!("{}: {}", name.unwrap_or("_"), ty(&p[1])),
            })
            .collect();
        s.push_str(&format!(
            "fn {path}{}({})",
            generics(&f["generics"]),
            inputs.join(", ")
        ));
        if !f["sig"]["output"].is_null() {
            s.push_str(&format!(" -> {}", ty(&f["sig"]["output"])));
        }
        s.push_str(&where_clause(&f["generics"]));
        s
    }

    /// Fields, variants, inherent items and trait impls of `item`, under `path`.
    fn members(&self, item: &str, path: &str, lines: &mut BTreeSet<String>) {
        let Some(it) = self.item(item) else { return };
        let inner = &it["inner"];
        let (impls, fields) = match Self::kind(it) {
            "struct" => {
                let kind = &inner["struct"]["kind"];
                let fields = kind["plain"]["fields"]
                    .as_array()
                    .or(kind["tuple"].as_array());
                (&inner["struct"]["impls"], fields)
            }
            "enum" => {
                for v in inner["enum"]["variants"].as_array().into_iter().flatten() {
                    if let Some(v) = self.item(&id(v)) {
                        self.variant(v, path, lines);
                    }
                }
                (&inner["enum"]["impls"], None)
            }
            "trait" => {
                for i in inner["trait"]["items"].as_array().into_iter().flatten() {
                    self.assoc(&id(i), path, lines);
                }
                return;
            }
            _ => return,
        };
        for (n, f) in fields.into_iter().flatten().enumerate() {
            if let Some(f) = self.item(&id(f)).filter(|f| f["visibility"] == "public") {
                let name = f["name"].as_str().map_or(n.to_string(), str::to_owned);
                lines.insert(format!(
                    "field {path}::{name}: {}",
                    ty(&f["inner"]["struct_field"])
                ));
            }
        }
        for i in impls.as_array().into_iter().flatten() {
            let Some(imp) = self.item(&id(i)) else {
                continue;
            };
            let imp = &imp["inner"]["impl"];
            if !imp["blanket_impl"].is_null() {
                continue;
            }
            if imp["trait"].is_null() {
                for member in imp["items"].as_array().into_iter().flatten() {
                    let Some(m) = self.item(&id(member)) else {
                        continue;
                    };
                    if m["visibility"] == "public" {
                        self.assoc(&id(member), path, lines);
                    }
                }
            } else {
                let not = if imp["is_negative"] == true { "!" } else { "" };
                lines.insert(format!(
                    "impl{} {not}{} for {path}{}",
                    generics(&imp["generics"]),
                    path_of(&imp["trait"]),
                    where_clause(&imp["generics"])
                ));
            }
        }
    }

    fn variant(&self, v: &Value, path: &str, lines: &mut BTreeSet<String>) {
        let name = v["name"].as_str().unwrap_or("?");
        let kind = &v["inner"]["variant"]["kind"];
        let field_ids = kind["struct"]["fields"]
            .as_array()
            .or(kind["tuple"].as_array());
        let fields: Vec<String> = field_ids
            .into_iter()
            .flatten()
            .filter_map(|f| self.item(&id(f)))
            .map(|f| {
                let t = ty(&f["inner"]["struct_field"]);
                match f["name"].as_str() {
                    Some(n) if kind.get("struct").is_some() => format!("{n}: {t}"),
                    _ => t,
                }
            })
            .collect();
        let shape = match (kind.get("struct"), kind.get("tuple")) {
            (Some(_), _) => format!(" {{ {} }}", fields.join(", ")),
            (_, Some(_)) => format!("({})", fields.join(", ")),
            _ => String::new(),
        };
        lines.insert(format!("variant {path}::{name}{shape}"));
    }

    fn assoc(&self, member: &str, path: &str, lines: &mut BTreeSet<String>) {
        let Some(m) = self.item(member) else { return };
        let name = m["name"].as_str().unwrap_or("?");
        let at = format!("{path}::{name}");
        let inner = &m["inner"];
        lines.insert(match Self::kind(m) {
            "function" => self.function(&at, &inner["function"]),
            "assoc_const" => format!("const {at}: {}", ty(&inner["assoc_const"]["type"])),
            "assoc_type" => format!("type {at}"),
            "constant" => format!("const {at}: {}", ty(&inner["constant"]["type"])),
            other => format!("{other} {at}"),
        });
    }
}

fn self_param(t: &Value) -> String {
    match t.get("borrowed_ref") {
        Some(r) if r["type"]["generic"] == "Self" => {
            let m = if r["is_mutable"] == true { "mut " } else { "" };
            format!("&{}{m}self", lifetime(&r["lifetime"]))
        }
        _ if t["generic"] == "Self" => "self".to_owned(),
        _ => format!("self: {}", ty(t)),
    }
}

fn lifetime(l: &Value) -> String {
    l.as_str().map_or(String::new(), |l| format!("{l} "))
}

fn path_of(p: &Value) -> String {
    format!("{}{}", p["path"].as_str().unwrap_or("?"), args(&p["args"]))
}

fn args(a: &Value) -> String {
    if let Some(ab) = a.get("angle_bracketed") {
        let mut parts: Vec<String> = ab["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(
                |g| match (g.get("type"), g.get("lifetime"), g.get("const")) {
                    (Some(t), _, _) => ty(t),
                    (_, Some(l), _) => l.as_str().unwrap_or("'_").to_owned(),
                    (_, _, Some(c)) => c["expr"].as_str().unwrap_or("_").to_owned(),
                    _ => "_".to_owned(),
                },
            )
            .collect();
        for c in ab["constraints"].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or("?");
            parts.push(match c["binding"].get("equality") {
                Some(e) => format!("{name} = {}", ty(&e["type"])),
                None => format!("{name}: {}", bounds(&c["binding"]["constraint"])),
            });
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("<{}>", parts.join(", "))
        }
    } else if let Some(p) = a.get("parenthesized") {
        let inputs: Vec<String> = p["inputs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(ty)
            .collect();
        let output = if p["output"].is_null() {
            String::new()
        } else {
            format!(" -> {}", ty(&p["output"]))
        };
        format!("({}){output}", inputs.join(", "))
    } else {
        String::new()
    }
}

fn bounds(b: &Value) -> String {
    let parts: Vec<String> = b
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| match (b.get("trait_bound"), b.get("outlives")) {
            (Some(t), _) => {
                let maybe = if t["modifier"] == "maybe" { "?" } else { "" };
                format!("{maybe}{}", path_of(&t["trait"]))
            }
            (_, Some(l)) => l.as_str().unwrap_or("'_").to_owned(),
            _ => "use<..>".to_owned(),
        })
        .collect();
    parts.join(" + ")
}

fn generics(g: &Value) -> String {
    let params: Vec<String> = g["params"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["kind"]["type"]["is_synthetic"] != true)
        .map(|p| {
            let name = p["name"].as_str().unwrap_or("?");
            let kind = &p["kind"];
            if let Some(t) = kind.get("type") {
                let b = bounds(&t["bounds"]);
                if b.is_empty() {
                    name.to_owned()
                } else {
                    format!("{name}: {b}")
                }
            } else if let Some(c) = kind.get("const") {
                format!("const {name}: {}", ty(&c["type"]))
            } else {
                name.to_owned()
            }
        })
        .collect();
    if params.is_empty() {
        String::new()
    } else {
        format!("<{}>", params.join(", "))
    }
}

fn where_clause(g: &Value) -> String {
    let preds: Vec<String> = g["where_predicates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let b = p.get("bound_predicate")?;
            Some(format!("{}: {}", ty(&b["type"]), bounds(&b["bounds"])))
        })
        .collect();
    if preds.is_empty() {
        String::new()
    } else {
        format!(" where {}", preds.join(", "))
    }
}

/// A type as source would spell it, near enough to tell two signatures apart.
fn ty(t: &Value) -> String {
    let Some((kind, v)) = t.as_object().and_then(|o| o.iter().next()) else {
        return t.as_str().unwrap_or("?").to_owned();
    };
    match kind.as_str() {
        "resolved_path" => path_of(v),
        "generic" | "primitive" => v.as_str().unwrap_or("?").to_owned(),
        "borrowed_ref" => {
            let m = if v["is_mutable"] == true { "mut " } else { "" };
            format!("&{}{m}{}", lifetime(&v["lifetime"]), ty(&v["type"]))
        }
        "raw_pointer" => {
            let m = if v["is_mutable"] == true {
                "mut"
            } else {
                "const"
            };
            format!("*{m} {}", ty(&v["type"]))
        }
        "tuple" => {
            let parts: Vec<String> = v.as_array().into_iter().flatten().map(ty).collect();
            format!("({})", parts.join(", "))
        }
        "slice" => format!("[{}]", ty(v)),
        "array" => format!("[{}; {}]", ty(&v["type"]), v["len"].as_str().unwrap_or("_")),
        "impl_trait" => format!("impl {}", bounds(v)),
        "dyn_trait" => {
            let mut parts: Vec<String> = v["traits"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| path_of(&p["trait"]))
                .collect();
            if let Some(l) = v["lifetime"].as_str() {
                parts.push(l.to_owned());
            }
            format!("dyn {}", parts.join(" + "))
        }
        "qualified_path" => {
            let (self_type, name) = (ty(&v["self_type"]), v["name"].as_str().unwrap_or("?"));
            match v["trait"]["path"].as_str() {
                // `F::Output` with `F: Future` in scope: rustdoc leaves the trait unnamed.
                None | Some("") => format!("{self_type}::{name}"),
                Some(_) => format!("<{self_type} as {}>::{name}", path_of(&v["trait"])),
            }
        }
        "function_pointer" => {
            let inputs: Vec<String> = v["sig"]["inputs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| ty(&p[1]))
                .collect();
            let out = if v["sig"]["output"].is_null() {
                String::new()
            } else {
                format!(" -> {}", ty(&v["sig"]["output"]))
            };
            format!("fn({}){out}", inputs.join(", "))
        }
        "infer" => "_".to_owned(),
        other => format!("<{other}>"),
    }
}
