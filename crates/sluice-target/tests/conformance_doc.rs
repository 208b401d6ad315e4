//! `docs/conformance.md` and the tests stay in step: every row of its
//! tables has an ID (unique), at least one test reference
//! `` `crates/<crate>/<path>.rs::<fn>` ``, and every referenced function
//! exists in that file; every tolerated case the target records is listed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Row {
    line: usize,
    id: String,
    tests: Vec<(String, String)>,
}

/// The rows of every table whose header starts with `| ID |`.
fn rows(doc: &str) -> Vec<Row> {
    let mut out = Vec::new();
    let mut in_table = false;
    for (i, line) in doc.lines().enumerate() {
        let l = line.trim();
        if !l.starts_with('|') {
            in_table = false;
            continue;
        }
        if l.starts_with("| ID |") {
            in_table = true;
            continue;
        }
        if !in_table || l.starts_with("|---") || l.starts_with("| ---") {
            continue;
        }
        let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
        let id = cells[0].trim().to_string();
        let last = cells.last().copied().unwrap_or("");
        let mut tests = Vec::new();
        for part in last.split('`').skip(1).step_by(2) {
            if let Some((file, func)) = part.split_once("::") {
                tests.push((file.to_string(), func.to_string()));
            }
        }
        out.push(Row {
            line: i + 1,
            id,
            tests,
        });
    }
    out
}

#[test]
fn every_row_names_tests_that_exist() {
    let doc =
        std::fs::read_to_string(repo().join("docs/conformance.md")).expect("docs/conformance.md");
    let rows = rows(&doc);
    assert!(rows.len() > 100, "only {} rows found", rows.len());
    let mut ids = HashSet::new();
    let mut problems = Vec::new();
    for r in &rows {
        if !ids.insert(r.id.clone()) {
            problems.push(format!("line {}: ID {} twice", r.line, r.id));
        }
        if r.tests.is_empty() {
            problems.push(format!("line {}: {} names no test", r.line, r.id));
        }
        for (file, func) in &r.tests {
            let Ok(src) = std::fs::read_to_string(repo().join(file)) else {
                problems.push(format!("line {}: {}: no file {file}", r.line, r.id));
                continue;
            };
            let name = func.trim_end_matches("()");
            if !src.contains(&format!("fn {name}(")) {
                problems.push(format!("line {}: {}: no fn {name} in {file}", r.line, r.id));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_tolerated_case_is_listed() {
    let doc =
        std::fs::read_to_string(repo().join("docs/conformance.md")).expect("docs/conformance.md");
    for t in sluice_target::tolerated::Tolerated::ALL {
        assert!(
            doc.contains(&format!("`{}`", t.name())),
            "{} is not in docs/conformance.md",
            t.name()
        );
    }
}

#[test]
fn the_checker_sees_a_missing_test() {
    let doc = "| ID | Input | Test |\n|---|---|---|\n| X-1 | a | `crates/sluice-target/tests/conformance_doc.rs::no_such_fn` |\n";
    let r = rows(doc);
    assert_eq!(r.len(), 1);
    assert_eq!(
        r[0].tests,
        vec![(
            "crates/sluice-target/tests/conformance_doc.rs".to_string(),
            "no_such_fn".to_string()
        )]
    );
    let src = std::fs::read_to_string(repo().join(&r[0].tests[0].0)).unwrap();
    assert!(!src.contains(&format!("fn {}(", "no_such_fn")));
}
