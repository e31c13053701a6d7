//! The eBPF crate's modules stand in floors: each file imports only from files below it, so the
//! import graph is a stack, never a circle (issue 34). A circle makes every file in it a
//! prerequisite of every other: none can be read, changed or moved alone, and a change to the
//! family trait ripples through the ICMP, rewrite and fragment code it called up into.
//!
//! The test reads `masq-ebpf/src/*.rs`, collects each file's references to the crate's other
//! modules (`use crate::{a, b::c}`, `crate::a::f(..)` in code, comments and strings left out),
//! and fails naming a circle if there is one, with every module caught in one; otherwise it
//! prints the floors, each module on the floor above the highest one it imports from. The crate root (`main.rs`) declares the
//! modules and holds the programs' entry points: it is on top by construction and not read.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// Each module, by file name, and the crate's modules it refers to (itself left out).
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The import graph of the modules in `src` (a crate's source directory, flat, as masq-ebpf's
/// is). Modules in subdirectories would be missed: the test checks there are none.
fn module_graph(src: &Path) -> std::io::Result<Graph> {
    let mut sources = BTreeMap::new();
    for entry in std::fs::read_dir(src)? {
        let path = entry?.path();
        let Some(name) = path.file_stem().and_then(|stem| stem.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|extension| extension == "rs") && name != "main" {
            sources.insert(name.to_owned(), std::fs::read_to_string(&path)?);
        }
    }
    Ok(graph_of(&sources))
}

/// The import graph of `sources` (module name to its source).
fn graph_of(sources: &BTreeMap<String, String>) -> Graph {
    sources
        .iter()
        .map(|(name, source)| {
            let imports = references(&code_only(source))
                .into_iter()
                .filter(|module| module != name && sources.contains_key(module))
                .collect();
            (name.clone(), imports)
        })
        .collect()
}

/// `source` with its comments and the contents of its string and character literals blanked
/// out: a doc link or a message that names `crate::x` is no import.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut code = String::with_capacity(source.len());
    let mut at = 0;
    while at < chars.len() {
        let here = chars[at];
        let next = chars.get(at + 1).copied();
        if here == '/' && next == Some('/') {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
        } else if here == '/' && next == Some('*') {
            let mut depth = 0;
            while at < chars.len() {
                match (chars[at], chars.get(at + 1).copied()) {
                    ('/', Some('*')) => {
                        depth += 1;
                        at += 2;
                    }
                    ('*', Some('/')) => {
                        depth -= 1;
                        at += 2;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => at += 1,
                }
            }
            code.push(' ');
        } else if here == '"' {
            at += 1;
            while at < chars.len() && chars[at] != '"' {
                at += if chars[at] == '\\' { 2 } else { 1 };
            }
            at += 1;
            code.push_str("\"\"");
        } else if here == '\'' && (chars.get(at + 2) == Some(&'\'') || next == Some('\\')) {
            // A character literal (a lifetime has no closing quote after one character).
            at += 1;
            while at < chars.len() && chars[at] != '\'' {
                at += if chars[at] == '\\' { 2 } else { 1 };
            }
            at += 1;
            code.push_str("' '");
        } else {
            code.push(here);
            at += 1;
        }
    }
    code
}

/// The first path segment after every `crate::` (or `super::`: every file here is a child of
/// the crate root) in `code`, and each first segment of a `crate::{...}` group.
fn references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for prefix in ["crate::", "super::"] {
        for (start, _) in code.match_indices(prefix) {
            if code[..start].chars().next_back().is_some_and(is_identifier) {
                continue;
            }
            let rest = code[start + prefix.len()..].trim_start();
            let items = match rest.strip_prefix('{') {
                Some(group) => top_level_items(group),
                None => vec![rest],
            };
            for item in items {
                let name: String = item
                    .trim_start()
                    .chars()
                    .take_while(|&character| is_identifier(character))
                    .collect();
                if !name.is_empty() && name != "self" {
                    found.insert(name);
                }
            }
        }
    }
    found
}

fn is_identifier(character: char) -> bool {
    character.is_alphanumeric() || character == '_'
}

/// The items of a `{...}` use group whose opening brace `group` follows: split at the commas
/// outside nested groups, up to the closing brace.
fn top_level_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0_u32;
    let mut item_start = 0;
    for (at, character) in group.char_indices() {
        match character {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[item_start..at]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[item_start..at]);
                item_start = at + 1;
            }
            _ => {}
        }
    }
    items.push(&group[item_start..]);
    items
}

/// A circle of imports in `graph`, as the modules along it with the first repeated at the end,
/// if there is one.
fn find_circle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Mark {
        OnPath,
        Done,
    }
    fn visit(
        graph: &Graph,
        module: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(module) {
            Some(Mark::Done) => return None,
            Some(Mark::OnPath) => {
                let from = path.iter().position(|on| on == module).unwrap_or(0);
                let mut circle = path[from..].to_vec();
                circle.push(module.to_owned());
                return Some(circle);
            }
            None => {}
        }
        marks.insert(module.to_owned(), Mark::OnPath);
        path.push(module.to_owned());
        for import in graph.get(module).into_iter().flatten() {
            if let Some(circle) = visit(graph, import, marks, path) {
                return Some(circle);
            }
        }
        path.pop();
        marks.insert(module.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut marks, &mut Vec::new()))
}

/// The groups of modules that all import each other, directly or round longer loops (the
/// strongly connected components of more than one module), each sorted, in order.
fn tangles(graph: &Graph) -> Vec<Vec<String>> {
    fn reach(graph: &Graph, from: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut next = vec![from.to_owned()];
        while let Some(module) = next.pop() {
            for import in graph.get(&module).into_iter().flatten() {
                if seen.insert(import.clone()) {
                    next.push(import.clone());
                }
            }
        }
        seen
    }
    let reached: BTreeMap<&String, BTreeSet<String>> = graph
        .keys()
        .map(|module| (module, reach(graph, module)))
        .collect();
    let mut tangles: Vec<Vec<String>> = Vec::new();
    for (module, reaches) in &reached {
        if tangles.iter().flatten().any(|placed| placed == *module) {
            continue;
        }
        let tangle: Vec<String> = reaches
            .iter()
            .filter(|other| reached[other].contains(*module))
            .cloned()
            .collect();
        if tangle.len() > 1 {
            tangles.push(tangle);
        }
    }
    tangles
}

/// The floors of an acyclic `graph`, lowest first: a module that imports none is on floor 0,
/// any other one floor above the highest module it imports.
fn floors(graph: &Graph) -> Vec<Vec<String>> {
    fn floor_of(graph: &Graph, module: &str, known: &mut BTreeMap<String, usize>) -> usize {
        if let Some(&floor) = known.get(module) {
            return floor;
        }
        let floor = graph
            .get(module)
            .into_iter()
            .flatten()
            .map(|import| floor_of(graph, import, known) + 1)
            .max()
            .unwrap_or(0);
        known.insert(module.to_owned(), floor);
        floor
    }
    let mut known = BTreeMap::new();
    let mut floors: Vec<Vec<String>> = Vec::new();
    for module in graph.keys() {
        let floor = floor_of(graph, module, &mut known);
        if floors.len() <= floor {
            floors.resize(floor + 1, Vec::new());
        }
        floors[floor].push(module.clone());
    }
    floors
}

/// The floors as lines, highest first, each module with what it imports.
fn describe(graph: &Graph, floors: &[Vec<String>]) -> String {
    let mut text = String::new();
    for (floor, modules) in floors.iter().enumerate().rev() {
        text.push_str(&format!("floor {floor}:\n"));
        for module in modules {
            let imports: Vec<&str> = graph[module].iter().map(String::as_str).collect();
            text.push_str(&format!("  {module} <- {}\n", imports.join(", ")));
        }
    }
    text
}

/// masq-ebpf's modules import each other in floors, never in a circle.
#[test]
fn ebpf_modules_form_floors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../masq-ebpf/src");
    let nested = std::fs::read_dir(&src)
        .expect("masq-ebpf/src is readable")
        .filter_map(Result::ok)
        .filter(|entry| entry.path().is_dir())
        .count();
    assert_eq!(
        nested, 0,
        "masq-ebpf/src has subdirectories, which this test does not read"
    );
    let graph = module_graph(&src).expect("masq-ebpf/src is readable");
    assert!(
        graph.len() > 10 && graph.values().any(|imports| !imports.is_empty()),
        "masq-ebpf/src holds too few modules, or none imports another: {graph:?}"
    );
    if let Some(circle) = find_circle(&graph) {
        let tangles: Vec<String> = tangles(&graph)
            .iter()
            .map(|tangle| format!("{} ({})", tangle.join(", "), tangle.len()))
            .collect();
        panic!(
            "masq-ebpf's modules import each other in a circle: {}; of its {} modules, these \
             all reach each other: {}. Move what the lower one needs below it (see \
             docs/datapath.md, \"The code\")",
            circle.join(" -> "),
            graph.len(),
            tangles.join("; ")
        );
    }
    print!("{}", describe(&graph, &floors(&graph)));
}

/// The check finds a circle however the imports are spelled, and only real imports count.
#[test]
fn a_circle_is_named() {
    let sources: BTreeMap<String, String> = [
        (
            "a",
            "use crate::{b::{self, X}, c};\n// crate::d is a comment\nfn f() {}",
        ),
        ("b", "use crate::verdict::Verdict;\nlet s = \"crate::a\";"),
        ("c", "fn g() { crate::b::f(); }"),
        ("d", "fn h() -> u8 { super::a::VALUE }"),
        ("verdict", "pub(crate) enum Verdict {}"),
    ]
    .into_iter()
    .map(|(name, source)| (name.to_owned(), source.to_owned()))
    .collect();
    let graph = graph_of(&sources);
    let imports = |module: &str| graph[module].iter().cloned().collect::<Vec<_>>();
    assert_eq!(imports("a"), ["b", "c"]);
    assert_eq!(imports("b"), ["verdict"]);
    assert_eq!(imports("d"), ["a"]);
    assert_eq!(find_circle(&graph), None);
    assert!(tangles(&graph).is_empty());
    assert_eq!(
        floors(&graph),
        [vec!["verdict"], vec!["b"], vec!["c"], vec!["a"], vec!["d"]]
    );

    let mut circular = sources;
    circular.insert("verdict".to_owned(), "use crate::d;".to_owned());
    let circular = graph_of(&circular);
    assert_eq!(
        tangles(&circular),
        [["a", "b", "c", "d", "verdict"].map(str::to_owned).to_vec()]
    );
    assert_eq!(
        find_circle(&circular),
        Some(["a", "b", "verdict", "d", "a"].map(str::to_owned).to_vec())
    );
}
