//! The docs and the server say the same about each command: the commands
//! are the server's (`COMMAND LIST` of `lease.*` on a server with the
//! module loaded), the pages are what docs/commands/ holds, and each
//! command has its page (a public command: docs/commands/<name>.md, in the
//! index docs/commands/README.md) or its section (an internal command:
//! docs/internals.md), and each page its command. The syntax line,
//! summary, version, complexity, ACL categories and history of every page
//! (and the syntax of every internal command) are what `COMMAND DOCS` and
//! `COMMAND INFO` answer. The command table in src/module/entry/table.rs
//! is the one source; a change there that the docs do not follow fails
//! here. Likewise every `lease.*` config of a server is a row of
//! docs/configuration.md, with its default and bounds.
//! And the checkable claims about the files of deploy/ (bind, protected
//! mode, passwords, `dir`) and about `LEASE.GATE` in `INFO commandstats`.
mod common;
use common::*;

use std::path::PathBuf;

fn doc_page(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text_of(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(t) => t.clone(),
        Value::Int(n) => n.to_string(),
        other => panic!("not a string: {other:?}"),
    }
}

/// A RESP2 flat map (`[k1, v1, k2, v2, ...]`) as pairs.
fn pairs(v: &Value) -> Vec<(String, Value)> {
    let Value::Array(items) = v else {
        panic!("not a flat map: {v:?}")
    };
    items
        .chunks(2)
        .map(|kv| (text_of(&kv[0]), kv[1].clone()))
        .collect()
}

fn get(v: &Value, key: &str) -> Option<Value> {
    pairs(v).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn list(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items.clone(),
        Value::Set(items) => items.clone(),
        other => panic!("not a list: {other:?}"),
    }
}

/// One argument as Redis's command pages write it: `[optional]`,
/// `<required | oneof>`, `multiple [multiple ...]`, `TOKEN name`.
fn render(arg: &Value) -> String {
    let kind = get(arg, "type").map(|v| text_of(&v)).unwrap_or_default();
    let name = get(arg, "name").map(|v| text_of(&v)).unwrap_or_default();
    let token = get(arg, "token").map(|v| text_of(&v));
    let flags: Vec<String> =
        get(arg, "flags").map_or(vec![], |f| list(&f).iter().map(text_of).collect());
    let subs = || -> Vec<String> {
        get(arg, "arguments").map_or(vec![], |a| list(&a).iter().map(render).collect())
    };
    let optional = flags.iter().any(|f| f == "optional");
    let mut text = match kind.as_str() {
        "pure-token" => token.clone().unwrap_or(name),
        "oneof" => subs().join(" | "),
        "block" => subs().join(" "),
        _ => match &token {
            Some(t) => format!("{t} {name}"),
            None => name,
        },
    };
    if flags.iter().any(|f| f == "multiple") {
        text = format!("{text} [{text} ...]");
    }
    if optional {
        format!("[{text}]")
    } else if kind == "oneof" {
        format!("<{text}>")
    } else {
        text
    }
}

/// `name args...` as the server documents it.
fn syntax(name: &str, docs: &Value) -> String {
    let args: Vec<String> =
        get(docs, "arguments").map_or(vec![], |a| list(&a).iter().map(render).collect());
    std::iter::once(name.to_string())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

fn command_docs(c: &mut redis::Connection, name: &str) -> Value {
    let v = ok(c, &["COMMAND", "DOCS", name]);
    let all = list(&v);
    assert_eq!(all.len(), 2, "COMMAND DOCS {name}: {v:?}");
    all[1].clone()
}

/// The first fenced block of `text` after `from`, its first line.
fn first_code_line(text: &str) -> Option<String> {
    let start = text.find("```")?;
    let body = &text[start..];
    let body = &body[body.find('\n')? + 1..];
    Some(body.lines().next()?.trim().to_string())
}

/// The value of a `| Label | value |` row.
fn row(page: &str, label: &str) -> Option<String> {
    let prefix = format!("| {label} |");
    page.lines().find(|l| l.starts_with(&prefix)).map(|l| {
        l[prefix.len()..]
            .trim()
            .trim_end_matches('|')
            .trim()
            .to_string()
    })
}

/// The `- ...` lines of the page's `## History` section.
fn history(page: &str) -> Vec<String> {
    let Some(at) = page.find("\n## History") else {
        return vec![];
    };
    page[at + 1..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("- "))
        .map(str::to_string)
        .collect()
}

/// The module's commands on a server, upper case, sorted.
fn server_commands(c: &mut redis::Connection) -> Vec<String> {
    let v = ok(c, &["COMMAND", "LIST", "FILTERBY", "PATTERN", "lease.*"]);
    let mut names: Vec<String> = list(&v).iter().map(|n| text_of(n).to_uppercase()).collect();
    names.sort();
    names
}

/// The command pages on disk (docs/commands/*.md but the index), as
/// command names, sorted.
fn command_pages() -> Vec<String> {
    let dir = repo_file("docs/commands");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("docs/commands/")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|f| f.ends_with(".md") && f != "README.md")
        .map(|f| f.trim_end_matches(".md").to_uppercase())
        .collect();
    names.sort();
    names
}

/// The internal commands docs/commands/README.md names (its one line of
/// them, as `LEASE.X` in backquotes).
fn internal_in_index(index: &str) -> Vec<String> {
    let at = index
        .find("internal commands")
        .expect("docs/commands/README.md names the internal commands");
    let para = &index[at..index[at..].find("\n\n").map_or(index.len(), |e| at + e)];
    let mut names: Vec<String> = para
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.starts_with("LEASE."))
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// Every command of the server has its page (public) or its section of
/// docs/internals.md (internal), never both, and every page its command;
/// the index lists every page, and names every internal command.
fn commands_and_pages(c: &mut redis::Connection) -> (Vec<String>, Vec<String>) {
    let commands = server_commands(c);
    assert!(commands.len() >= 10, "COMMAND LIST: {commands:?}");
    let pages = command_pages();
    let internals = doc_page("docs/internals.md");
    let index = doc_page("docs/commands/README.md");
    let (public, internal): (Vec<String>, Vec<String>) =
        commands.iter().cloned().partition(|n| pages.contains(n));
    for name in &pages {
        assert!(
            commands.contains(name),
            "docs/commands/{}.md: no such command on the server",
            name.to_lowercase()
        );
    }
    for name in &internal {
        assert!(
            internals.contains(&format!("\n### {name}\n")),
            "{name}: no page docs/commands/{}.md, nor a section in docs/internals.md",
            name.to_lowercase()
        );
    }
    for name in &public {
        assert!(
            !internals.contains(&format!("\n### {name}\n")),
            "{name}: a page and an internal section"
        );
        assert!(
            index.contains(&format!("[{name}]({}.md)", name.to_lowercase())),
            "docs/commands/README.md does not index {name}"
        );
    }
    assert_eq!(
        internal_in_index(&index),
        internal,
        "docs/commands/README.md: the internal commands"
    );
    (public, internal)
}

full_suite! {
    fn every_command_page_says_what_command_docs_says(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let (public, internal) = commands_and_pages(&mut c);
        for name in &public {
            let name = name.as_str();
            let rel = format!("docs/commands/{}.md", name.to_lowercase());
            let page = doc_page(&rel);
            let docs = command_docs(&mut c, name);
            let field = |k: &str| get(&docs, k).map(|v| text_of(&v));
            assert!(page.starts_with(&format!("# {name}\n")), "{rel}: its title");
            assert_eq!(first_code_line(&page), Some(syntax(name, &docs)), "{rel}: the syntax");
            assert_eq!(row(&page, "Summary"), field("summary"), "{rel}: the summary");
            assert_eq!(row(&page, "Available since"), field("since"), "{rel}: since");
            assert_eq!(row(&page, "Time complexity"), field("complexity"), "{rel}: the complexity");
            let mut want = vec![format!("{}: Added.", field("since").unwrap_or_default())];
            for entry in get(&docs, "history").map_or(vec![], |h| list(&h)) {
                let e = list(&entry);
                want.push(format!("{}: {}", text_of(&e[0]), text_of(&e[1])));
            }
            assert_eq!(history(&page), want, "{rel}: the history");
            // ACL categories, where the server lets modules add theirs.
            let info = list(&ok(&mut c, &["COMMAND", "INFO", name]));
            let categories: Vec<String> = list(&list(&info[0])[6]).iter().map(text_of).collect();
            if categories.iter().any(|x| x == "@lease") {
                let shown = row(&page, "ACL categories").unwrap_or_default();
                let listed: Vec<String> = shown.split(", ").map(|x| x.trim_matches('`').to_string()).collect();
                assert_eq!(listed, categories, "{rel}: the ACL categories");
            }
        }
        // The internal commands, on the internals page.
        let internals = doc_page("docs/internals.md");
        for name in &internal {
            let name = name.as_str();
            let docs = command_docs(&mut c, name);
            let heading = format!("### {name}\n");
            let at = internals
                .find(&heading)
                .unwrap_or_else(|| panic!("docs/internals.md: no heading {heading:?}"));
            assert_eq!(
                first_code_line(&internals[at..]),
                Some(syntax(name, &docs)),
                "docs/internals.md: the syntax of {name}"
            );
        }
    }
}

/// A row `| \`name\` | default | min..max | ... |` of the settings table.
fn setting_row(page: &str, name: &str) -> Option<(i64, i64, i64)> {
    let line = page
        .lines()
        .find(|l| l.starts_with(&format!("| `{name}` |")))?;
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    let default = cells.get(2)?.parse().ok()?;
    let (min, max) = cells.get(3)?.split_once("..")?;
    Some((default, min.parse().ok()?, max.parse().ok()?))
}

full_suite! {
    fn the_configuration_page_gives_every_setting_as_the_server_has_it(kind) {
        // Every `lease.*` config of a fresh server is a row of the settings
        // table, with the default it starts with and the bounds CONFIG SET
        // enforces.
        // Loaded without arguments (the harness's servers get `grace-ms 0`).
        let s = Server::start_with(kind, Opts { no_module: true, ..Opts::default() }.extra(&["--enable-module-command", "yes"]));
        let mut c = s.conn();
        let path = module_path();
        ok(&mut c, &["MODULE", "LOAD", path.to_str().expect("a UTF-8 path")]);
        let page = doc_page("docs/configuration.md");
        let all = list(&ok(&mut c, &["CONFIG", "GET", "lease.*"]));
        assert!(all.len() >= 4, "{all:?}");
        for kv in all.chunks(2) {
            let full = text_of(&kv[0]);
            let name = full.trim_start_matches("lease.");
            let (default, min, max) = setting_row(&page, name)
                .unwrap_or_else(|| panic!("docs/configuration.md: no row `{name}` | default | min..max |"));
            assert_eq!(text_of(&kv[1]), default.to_string(), "{name}: the default");
            for (value, accepted) in [(min, true), (max, true), (min - 1, false), (max + 1, false)] {
                let set = call_args(&mut c, &["CONFIG".to_string(), "SET".to_string(), full.clone(), value.to_string()]);
                assert_eq!(set.is_ok(), accepted, "{name} {value}: {set:?}");
            }
            ok(&mut c, &["CONFIG", "SET", &full, &default.to_string()]);
        }
    }
}

// ---------------------------------------------------------------------------
// The production files of deploy/ (docs/operations.md, "Network and
// passwords"): what they promise an operator who copies them.

const DATA_NODE_FILES: [&str; 3] = [
    "deploy/standalone.conf",
    "deploy/sentinel/node.conf",
    "deploy/cluster/node.conf",
];
const SENTINEL_FILE: &str = "deploy/sentinel/sentinel.conf";

fn setting_lines(text: &str, name: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.split_whitespace().next() == Some(name))
        .map(str::to_string)
        .collect()
}

#[test]
fn deploy_files_listen_on_loopback_with_protected_mode_on() {
    for rel in DATA_NODE_FILES.iter().chain([&SENTINEL_FILE]) {
        let text = doc_page(rel);
        assert_eq!(
            setting_lines(&text, "bind"),
            ["bind 127.0.0.1 -::1"],
            "{rel}: one bind line, loopback as shipped"
        );
        assert_eq!(
            setting_lines(&text, "protected-mode"),
            ["protected-mode yes"],
            "{rel}"
        );
    }
}

#[test]
fn deploy_files_give_one_password_to_nodes_replication_and_sentinels() {
    // Commented out as shipped, with one placeholder everywhere: clients,
    // replication (any node may become the master) and Sentinel.
    let has = |rel: &str, line: &str| {
        assert!(
            doc_page(rel).lines().any(|l| l == line),
            "{rel} has no line {line:?}"
        );
    };
    for rel in DATA_NODE_FILES {
        has(rel, "# requirepass <password>");
    }
    for rel in &DATA_NODE_FILES[1..] {
        has(rel, "# masterauth <password>");
    }
    has(SENTINEL_FILE, "# sentinel auth-pass leases <password>");
    let ops = doc_page("docs/operations.md");
    assert!(ops.contains("## Network and passwords"), "operations.md");
}

#[test]
fn every_deploy_dir_is_created_before_the_first_start() {
    let ops = doc_page("docs/operations.md");
    for rel in DATA_NODE_FILES.iter().chain([&SENTINEL_FILE]) {
        let text = doc_page(rel);
        let dirs = setting_lines(&text, "dir");
        assert_eq!(dirs.len(), 1, "{rel}: one dir line");
        let dir = dirs[0].split_whitespace().nth(1).unwrap().to_string();
        let mkdir = format!("install -d -o redis -g redis -m 750 {dir}");
        assert!(text.contains(&mkdir), "{rel}: no {mkdir:?} before its dir");
        assert!(ops.contains(&mkdir), "operations.md: no {mkdir:?}");
    }
}

/// `calls=` of `cmdstat_LEASE.GATE` (0 when the line is missing), and
/// whether a line for it in another case exists.
fn gate_calls(c: &mut redis::Connection) -> (i64, bool) {
    let stats = ok_text(c, &["INFO", "commandstats"]);
    let calls = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_LEASE.GATE:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0);
    let other_case = stats.lines().any(|l| {
        l.to_lowercase().starts_with("cmdstat_lease.gate:") && !l.starts_with("cmdstat_LEASE.GATE:")
    });
    (calls, other_case)
}

full_suite! {
    // docs/internals.md, "LEASE.GATE": what INFO commandstats shows of the
    // grace period's write probe.
    fn lease_gate_shows_upper_case_in_commandstats_and_not_while_the_grace_is_paused(kind) {
        // A first start (no data) runs a grace period, paused: no good
        // replica for min-replicas-to-write 1.
        let s = Server::start_with(
            kind,
            Opts::default()
                .module_args(&["grace-ms", "5000"])
                .extra(&["--min-replicas-to-write", "1"]),
        );
        let mut c = s.conn();
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert_eq!(info_field(&mut c, "lease_grace_paused").as_deref(), Some("1"));
        assert_eq!(gate_calls(&mut c), (0, false), "{kind:?}: probes while paused (NOREPLICAS)");
        // Counting: about ten a second.
        assert_eq!(ok(&mut c, &["CONFIG", "SET", "min-replicas-to-write", "0"]), Value::Okay);
        std::thread::sleep(std::time::Duration::from_millis(1000));
        assert_eq!(info_field(&mut c, "lease_grace_paused").as_deref(), Some("0"));
        let (counting, other_case) = gate_calls(&mut c);
        assert!(!other_case, "{kind:?}: LEASE.GATE in another case");
        assert!((5..=15).contains(&counting), "{kind:?}: {counting} probes in 1 s of a counting grace");
        // Writes paused: the look makes no call.
        assert_eq!(ok(&mut c, &["CLIENT", "PAUSE", "1000", "WRITE"]), Value::Okay);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let before = gate_calls(&mut c).0;
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert_eq!(gate_calls(&mut c).0, before, "{kind:?}: probes while writes are paused");
        assert!(info_int(&mut c, "lease_grace_remaining_ms") > 0, "{kind:?}: the grace ended too soon");
    }
}

#[test]
fn internals_md_names_every_test_file() {
    let page = doc_page("docs/internals.md");
    let dir = repo_file("tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/") {
        let name = entry
            .expect("an entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".rs")
            && !page.contains(&format!("`{name}`"))
            && !page.contains(&format!("tests/{name}"))
        {
            missing.push(name);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/internals.md does not name {missing:?}"
    );
}

/// The sections of design.md the pages say it has ("S0 to Sn"): its last
/// `## Sn.` heading.
#[test]
fn the_readmes_name_design_mds_sections_as_they_are() {
    let design = doc_page("docs/design.md");
    let last = design
        .lines()
        .filter_map(|l| l.strip_prefix("## S"))
        .filter_map(|l| l.split('.').next()?.parse::<u32>().ok())
        .max()
        .expect("design.md has S sections");
    for rel in ["README.md", "docs/README.md"] {
        let page = doc_page(rel);
        let at = page
            .find("S0 to S")
            .unwrap_or_else(|| panic!("{rel}: no \"S0 to S\""));
        let named: String = page[at + 7..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert_eq!(
            named,
            last.to_string(),
            "{rel}: S0 to S{named}, design.md ends at S{last}"
        );
    }
}
