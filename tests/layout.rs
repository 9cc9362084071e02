//! The shape of `src/` (docs/internals.md, "Code layout"): no import cycle
//! among its files, and no `unsafe` outside the binding's wall
//! (`src/module/ffi/`), the exclusive lease's one allocation
//! (`src/lease/exclusive.rs`) and the module's registration (`src/lib.rs`).
//! Reads the sources; starts no server.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Where `unsafe` may be written.
const UNSAFE_ALLOWED: [&str; 3] = ["src/module/ffi/", "src/lease/exclusive.rs", "src/lib.rs"];

/// Module path (`["lease", "ops"]`) -> its file, relative to the crate.
type Tree = BTreeMap<Vec<String>, PathBuf>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under src/ (`src/lease/mod.rs` -> `lease`).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root().join("src")).expect("under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The source without comments and string literals (so that a path in a
/// doc comment or an error text is no import).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n'), not a lifetime.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Expands a use tree (`super::{a, b::{c, d}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![path.to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').expect("a closing brace")];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| {
            if p == "self" {
                prefix.trim_end_matches("::").to_string()
            } else {
                format!("{prefix}{p}")
            }
        })
        .collect()
}

/// Every path a file names: its `use` trees, expanded, and the paths in
/// its code that start at `crate::`, `super::` or one of its child modules.
fn paths_in(code: &str, children: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let tail = &rest[at + 3..];
        let end = tail.find(';').unwrap_or(tail.len());
        out.extend(expand(&tail[..end]));
        rest = &tail[end..];
    }
    let bytes = code.as_bytes();
    let starts: Vec<&str> = ["crate", "super"]
        .into_iter()
        .chain(children.iter().map(String::as_str))
        .collect();
    for start in starts {
        let needle = format!("{start}::");
        for (i, _) in code.match_indices(&needle) {
            if i > 0
                && (bytes[i - 1].is_ascii_alphanumeric()
                    || bytes[i - 1] == b'_'
                    || bytes[i - 1] == b':')
            {
                continue;
            }
            let len = code[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - i);
            out.push(code[i..i + len].trim_end_matches(':').to_string());
        }
    }
    out
}

/// The first occurrence of `word` as a whole word.
fn find_word(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    s.match_indices(word).map(|(i, _)| i).find(|&i| {
        let before = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let after = b
            .get(i + word.len())
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == b'_'));
        before && after
    })
}

/// What a `pub use` in a module re-exports: item name -> source module.
fn reexports(code: &str, here: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut rest = code;
    while let Some(at) = rest.find("pub use ") {
        let tail = &rest[at + 8..];
        let end = tail.find(';').unwrap_or(tail.len());
        for path in expand(&tail[..end]) {
            let mut segs: Vec<String> = path.split("::").map(str::to_string).collect();
            let item = segs.pop().unwrap_or_default();
            let mut module = here.to_vec();
            module.extend(segs);
            out.insert(item, module);
        }
        rest = &tail[end..];
    }
    out
}

/// The file a path leads to: as far as its segments name modules, then
/// through a re-export; `None` outside the crate.
fn resolve(
    path: &str,
    here: &[String],
    tree: &Tree,
    exports: &BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
) -> Option<Vec<String>> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut module, rest): (Vec<String>, &[&str]) = match segs.first()? {
        &"crate" => (Vec::new(), &segs[1..]),
        &"super" => {
            let mut m = here.to_vec();
            let mut i = 0;
            while segs.get(i) == Some(&"super") {
                m.pop();
                i += 1;
            }
            (m, &segs[i..])
        }
        &"self" => (here.to_vec(), &segs[1..]),
        first => {
            let mut child = here.to_vec();
            child.push(first.to_string());
            if !tree.contains_key(&child) {
                return None;
            }
            (here.to_vec(), &segs[..])
        }
    };
    for seg in rest {
        let mut next = module.clone();
        next.push(seg.to_string());
        if tree.contains_key(&next) {
            module = next;
        } else {
            if let Some(source) = exports.get(&module).and_then(|e| e.get(*seg)) {
                return Some(source.clone());
            }
            break;
        }
    }
    Some(module)
}

struct Crate {
    tree: Tree,
    /// File -> the files it uses.
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn read_crate() -> Crate {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let tree: Tree = files.iter().map(|f| (module_of(f), f.clone())).collect();
    let code: BTreeMap<Vec<String>, String> = tree
        .iter()
        .map(|(m, f)| {
            (
                m.clone(),
                code_only(&fs::read_to_string(f).expect("readable")),
            )
        })
        .collect();
    let exports = code
        .iter()
        .map(|(m, c)| (m.clone(), reexports(c, m)))
        .collect();
    let mut edges = BTreeMap::new();
    for (module, c) in &code {
        let children: BTreeSet<String> = tree
            .keys()
            .filter(|k| k.len() == module.len() + 1 && k.starts_with(module))
            .map(|k| k[module.len()].clone())
            .collect();
        let used: BTreeSet<Vec<String>> = paths_in(c, &children)
            .iter()
            .filter_map(|p| resolve(p, module, &tree, &exports))
            .filter(|target| target != module && !module.starts_with(target))
            .collect();
        edges.insert(module.clone(), used);
    }
    Crate { tree, edges }
}

/// A cycle among the files, if there is one (depth-first search).
fn find_cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        at: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        state.insert(at.clone(), 1);
        stack.push(at.clone());
        for next in edges.get(at).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|m| m == next).expect("on the stack");
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(at.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for start in edges.keys() {
        if state.get(start).copied().unwrap_or(0) == 0
            && let Some(c) = visit(start, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

fn shown(m: &[String]) -> String {
    if m.is_empty() {
        "lib".into()
    } else {
        m.join("::")
    }
}

#[test]
fn no_file_of_src_imports_one_that_imports_it_back() {
    let krate = read_crate();
    assert!(krate.tree.len() > 40, "read {} files", krate.tree.len());
    // The reader sees the imports it is meant to.
    let ops = &krate.edges[&vec!["lease".to_string(), "ops".to_string()]];
    assert!(
        ops.contains(&vec!["lease".to_string(), "effect".to_string()]),
        "{ops:?}"
    );
    let commands = &krate.edges[&vec!["module".to_string(), "commands".to_string()]];
    assert!(
        commands.contains(&vec!["lease".to_string(), "ops".to_string()]),
        "{commands:?}"
    );
    if let Some(cycle) = find_cycle(&krate.edges) {
        let names: Vec<String> = cycle.iter().map(|m| shown(m)).collect();
        panic!("import cycle: {}", names.join(" -> "));
    }
}

#[test]
fn the_pure_core_uses_nothing_of_the_binding() {
    let krate = read_crate();
    for (module, used) in &krate.edges {
        if module.first().map(String::as_str) == Some("lease") {
            for target in used {
                assert_eq!(
                    target.first().map(String::as_str),
                    Some("lease"),
                    "{} uses {}",
                    shown(module),
                    shown(target)
                );
            }
        }
    }
}

#[test]
fn unsafe_is_written_only_behind_the_wall() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut seen_in_wall = 0;
    for file in files {
        let rel = file
            .strip_prefix(root())
            .expect("in the crate")
            .to_string_lossy()
            .to_string();
        let code = code_only(&fs::read_to_string(&file).expect("readable"));
        let has = find_word(&code, "unsafe").is_some();
        let allowed = UNSAFE_ALLOWED.iter().any(|a| rel.starts_with(a));
        assert!(!has || allowed, "{rel} holds `unsafe` outside the wall");
        if has && rel.starts_with("src/module/ffi/") {
            seen_in_wall += 1;
        }
        // The crate denies unsafe code; only these may lift the denial.
        if code.contains("allow(unsafe_code)") {
            assert!(
                ["src/lib.rs", "src/lease/mod.rs", "src/module/mod.rs"].contains(&rel.as_str()),
                "{rel} allows unsafe code"
            );
        }
    }
    assert!(
        seen_in_wall >= 5,
        "the wall holds the raw calls ({seen_in_wall} files)"
    );
}

/// The `version = "..."` line of a manifest (Cargo.toml, pyproject.toml).
fn manifest_version(rel: &str) -> String {
    let text = fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{rel} has no version line"))
        .to_string()
}

#[test]
fn the_helpers_versions_follow_the_modules() {
    let module = manifest_version("Cargo.toml");
    assert_eq!(
        manifest_version("clients/rust/Cargo.toml"),
        module,
        "clients/rust/Cargo.toml"
    );
    assert_eq!(
        manifest_version("clients/python/pyproject.toml"),
        module,
        "clients/python/pyproject.toml"
    );
}

/// The binding's layers, bottom first (docs/internals.md, "Code layout"):
/// a file may import its own layer and those below, never one above.
const BINDING_LAYERS: [&[&str]; 6] = [
    &["ffi"],
    &[
        "version", "tokens", "counters", "settings", "timers", "early", "guards",
    ],
    &["commit"],
    &["grace", "compat", "waiters", "datatype", "fence", "info"],
    &["commands"],
    &["entry"],
];

/// The layer of a binding file (`["module", "ffi", "key"]` -> 0).
fn binding_layer(m: &[String]) -> Option<usize> {
    if m.first().map(String::as_str) != Some("module") || m.len() < 2 {
        return None;
    }
    BINDING_LAYERS
        .iter()
        .position(|layer| layer.contains(&m[1].as_str()))
}

/// Every import of a binding file from a layer above its own.
fn upward_imports(krate: &Crate) -> Vec<String> {
    let mut out = Vec::new();
    for (module, used) in &krate.edges {
        let Some(here) = binding_layer(module) else {
            continue;
        };
        for target in used {
            if binding_layer(target).is_some_and(|there| there > here) {
                out.push(format!("{} -> {}", shown(module), shown(target)));
            }
        }
    }
    out
}

#[test]
fn every_binding_file_has_a_layer() {
    let krate = read_crate();
    for module in krate.tree.keys() {
        if module.first().map(String::as_str) == Some("module") && module.len() > 1 {
            assert!(
                binding_layer(module).is_some(),
                "{} is in no layer of BINDING_LAYERS",
                shown(module)
            );
        }
    }
}

#[test]
fn the_wall_imports_nothing_of_the_binding_above_it() {
    let krate = read_crate();
    let ffi = vec!["module".to_string(), "ffi".to_string()];
    let mut seen = 0;
    for (module, used) in &krate.edges {
        if !module.starts_with(&ffi) {
            continue;
        }
        seen += 1;
        for target in used {
            let below =
                target.first().map(String::as_str) == Some("lease") || target.starts_with(&ffi);
            assert!(below, "{} uses {}", shown(module), shown(target));
        }
    }
    assert!(seen >= 10, "read {seen} files of ffi/");
}

#[test]
fn no_binding_file_imports_from_a_layer_above_its_own() {
    let krate = read_crate();
    let up = upward_imports(&krate);
    assert!(
        up.is_empty(),
        "{} upward imports:\n{}",
        up.len(),
        up.join("\n")
    );
}

// ---------------------------------------------------------------------------
// One word per concept (docs/internals.md, "Code layout": the word table).

/// The rows of the word table: (concept, the code's names, the words the
/// code never uses), each name as written between backquotes.
fn word_table() -> Vec<(String, Vec<String>, Vec<String>)> {
    let page = fs::read_to_string(root().join("docs/internals.md")).expect("docs/internals.md");
    let at = page
        .find("| concept | in the docs | in the code and tests | never in the code |")
        .expect("docs/internals.md has the word table, with its four columns");
    let quoted = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    page[at..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            assert_eq!(cells.len(), 4, "a row of four cells: {l}");
            (
                cells[0].trim_start_matches("| ").to_string(),
                quoted(cells[2]),
                quoted(cells[3].trim_end_matches(" |")),
            )
        })
        .collect()
}

/// The code of `src/` (comments and strings aside), file by file, and the
/// text of the tests and the clients' sources (a helper's names).
fn code_and_text() -> (Vec<(String, String)>, String) {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let code = files
        .iter()
        .map(|f| {
            let rel = f
                .strip_prefix(root())
                .expect("in the crate")
                .to_string_lossy()
                .to_string();
            (rel, code_only(&fs::read_to_string(f).expect("readable")))
        })
        .collect();
    let mut text = String::new();
    let mut more = Vec::new();
    for dir in [
        "tests",
        "clients/rust/src",
        "clients/python/src",
        "clients/node/src",
    ] {
        collect(&root().join(dir), &mut more);
    }
    for f in more {
        if let Ok(t) = fs::read_to_string(&f) {
            text.push_str(&t);
            text.push('\n');
        }
    }
    (code, text)
}

/// Every source file under `dir` (Rust, Python, TypeScript).
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if !path.ends_with("node_modules") && !path.ends_with("__pycache__") {
                collect(&path, out);
            }
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "py" || e == "ts")
        {
            out.push(path);
        }
    }
}

/// Does the code name `name` (`a::b::C`: its last segment as a word, and a
/// module path as its file; `tests/x*.rs`: a test file)?
fn named(name: &str, code: &[(String, String)], text: &str) -> bool {
    if let Some(pattern) = name.strip_prefix("tests/") {
        let (head, tail) = pattern
            .split_once('*')
            .unwrap_or((pattern.trim_end_matches(".rs"), ".rs"));
        let head = head.trim_end_matches(".rs");
        return fs::read_dir(root().join("tests"))
            .expect("tests/")
            .filter_map(|e| e.ok())
            .any(|e| {
                let f = e.file_name().to_string_lossy().to_string();
                f.starts_with(head) && f.ends_with(tail)
            });
    }
    let segs: Vec<&str> = name.split("::").collect();
    if segs.len() == 2 && ["lease", "module"].contains(&segs[0]) {
        let file = root()
            .join("src")
            .join(segs[0])
            .join(format!("{}.rs", segs[1]));
        if file.exists() {
            return true;
        }
    }
    let last = segs.last().copied().unwrap_or(name);
    code.iter().any(|(_, c)| find_word(c, last).is_some()) || find_word(text, last).is_some()
}

#[test]
fn the_code_uses_the_word_tables_names_and_never_its_synonyms() {
    let table = word_table();
    assert!(
        table.len() >= 5,
        "read {} rows of the word table",
        table.len()
    );
    let (code, text) = code_and_text();
    let mut wrong = Vec::new();
    for (concept, names, never) in &table {
        for name in names {
            // A name the row gives for the command itself (`MULTI`) or a
            // fragment (`Unguard` of `Effect::Guard`/`Unguard`) is a word too.
            if !named(name, &code, &text) {
                wrong.push(format!("{concept}: `{name}` is named nowhere in the code"));
            }
        }
        for word in never {
            for (rel, c) in &code {
                if find_word(c, word).is_some() {
                    wrong.push(format!("{concept}: {rel} says `{word}`"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the word table (docs/internals.md):\n{}",
        wrong.join("\n")
    );
}

/// The pure core defines each of its types once (round 4 of issue 44: it
/// had two `Outcome`, `Then`, `Env`, `Recheck` and `Decision`): one word,
/// one thing. Its tests' own reference model is left aside.
#[test]
fn the_core_defines_each_type_once() {
    let mut files = Vec::new();
    rust_files(&root().join("src/lease"), &mut files);
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files {
        let rel = f
            .strip_prefix(root())
            .expect("in the crate")
            .to_string_lossy()
            .to_string();
        if rel.ends_with("/model.rs") || rel.ends_with("/testkit.rs") {
            continue;
        }
        let src = fs::read_to_string(&f).expect("readable");
        // The code before its unit tests.
        let src = src.split("#[cfg(test)]\nmod tests").next().unwrap_or(&src);
        let code = code_only(src);
        for line in code.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let Some(i) = words
                .iter()
                .position(|w| ["struct", "enum", "type", "trait"].contains(w))
                && i > 0
                && words[i - 1].starts_with("pub")
                && let Some(name) = words.get(i + 1)
            {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                seen.entry(name).or_default().push(rel.clone());
            }
        }
    }
    assert!(seen.len() > 40, "read {} types of the core", seen.len());
    for word in ["Outcome", "Then", "Env", "Recheck", "Decision", "Snapshot"] {
        assert!(seen.contains_key(word), "the core defines no `{word}`");
    }
    let twice: Vec<String> = seen
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| format!("{name}: {}", at.join(", ")))
        .collect();
    assert!(
        twice.is_empty(),
        "types the core defines more than once:\n{}",
        twice.join("\n")
    );
}
