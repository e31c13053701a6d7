//! The documentation's relative links resolve: every link in `README.md` and `docs/*.md` that is
//! not an `http(s)://` or `mailto:` address points at a file or directory of the repository, and
//! its `#anchor`, if any, at a heading of the Markdown file it names, by GitHub's rules for
//! heading anchors. A broken link fails the test with the file, the line and the reason. Reads
//! the files only; needs no privileges.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Component, Path, PathBuf},
};

/// The repository's root: this crate lives one level below it.
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What a link's path names, as the checker needs to know it.
#[derive(Clone, Debug)]
enum Target {
    Missing,
    Directory,
    File(String),
}

/// Reads `path` (relative to the repository's root) from the disk.
fn read_from_disk(path: &Path) -> Target {
    let full = repository().join(path);
    if full.is_dir() {
        return Target::Directory;
    }
    // Only Markdown files are parsed; for others, existence is all that is checked.
    let is_markdown = path.extension().is_some_and(|extension| extension == "md");
    match fs::read(&full) {
        Ok(bytes) if is_markdown => Target::File(String::from_utf8_lossy(&bytes).into_owned()),
        Ok(_) => Target::File(String::new()),
        Err(_) => Target::Missing,
    }
}

/// The Markdown files whose links are checked, relative to the repository's root.
fn documents() -> Result<Vec<PathBuf>, String> {
    let docs = repository().join("docs");
    let entries =
        fs::read_dir(&docs).map_err(|error| format!("cannot list {}: {error}", docs.display()))?;
    let mut files = vec![PathBuf::from("README.md")];
    for entry in entries {
        let entry = entry.map_err(|error| format!("cannot list {}: {error}", docs.display()))?;
        let name = PathBuf::from(entry.file_name());
        if name.extension().is_some_and(|extension| extension == "md") {
            files.push(Path::new("docs").join(name));
        }
    }
    files.sort();
    Ok(files)
}

/// The text with every fenced code block's lines emptied (newlines kept, so line numbers stay),
/// which is where neither links nor headings are.
fn without_fences(text: &str) -> String {
    let mut fence: Option<(char, usize)> = None;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |c| trimmed.chars().take_while(|d| *d == c).count());
        match (fence, marker) {
            (None, Some(c)) if run >= 3 => fence = Some((c, run)),
            (Some((c, length)), Some(d))
                if c == d && run >= length && trimmed[run..].trim().is_empty() =>
            {
                fence = None;
            }
            (None, _) => {
                out.push_str(line);
                continue;
            }
            _ => {}
        }
        if line.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The text with the contents of every inline code span blanked (a run of backticks to the next
/// run of the same length in the same paragraph, as CommonMark reads them); newlines are kept.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let close = closing_run(&chars, i + run, run);
        match close {
            Some(end) => {
                for c in &chars[i..end + run] {
                    out.push(if *c == '\n' { '\n' } else { ' ' });
                }
                i = end + run;
            }
            None => {
                for _ in 0..run {
                    out.push('`');
                }
                i += run;
            }
        }
    }
    out
}

/// Where the run of exactly `run` backticks that closes a code span starting before `from`
/// begins, if the paragraph has one.
fn closing_run(chars: &[char], from: usize, run: usize) -> Option<usize> {
    let mut j = from;
    while j < chars.len() {
        if chars[j] == '\n' {
            // A blank line ends the paragraph, and with it any code span.
            let rest = chars[j + 1..].iter().take_while(|c| **c != '\n');
            if rest.clone().all(|c| c.is_whitespace()) {
                return None;
            }
        }
        if chars[j] == '`' {
            let length = chars[j..].iter().take_while(|c| **c == '`').count();
            if length == run {
                return Some(j);
            }
            j += length;
        } else {
            j += 1;
        }
    }
    None
}

/// Every link destination in a Markdown text, with its line (1-based): inline links and images
/// `[text](destination "title")` and reference definitions `[label]: destination`, outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let text = without_code_spans(&without_fences(text));
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix('[')
            && let Some((label, destination)) = rest.split_once("]:")
            && !label.is_empty()
            && !label.contains(']')
        {
            if let Some(destination) = destination.split_whitespace().next() {
                found.push((index + 1, unbracketed(destination).to_owned()));
            }
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let mut depth = 0_usize;
            let mut end = None;
            for (offset, c) in after.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = Some(offset);
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let Some(end) = end else { break };
            let inside = after[..end].trim();
            // A title follows the destination after whitespace.
            let destination = if inside.starts_with('<') {
                inside.split_once('>').map_or(inside, |(d, _)| &d[1..])
            } else {
                inside.split_whitespace().next().unwrap_or_default()
            };
            found.push((index + 1, unbracketed(destination).to_owned()));
            rest = &after[end..];
        }
    }
    found
}

fn unbracketed(destination: &str) -> &str {
    destination
        .strip_prefix('<')
        .and_then(|d| d.strip_suffix('>'))
        .unwrap_or(destination)
}

/// GitHub's anchor for a heading's text: inline links reduced to their text, lowercase, every
/// character but letters, digits, `-`, `_` and spaces removed, spaces turned into `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](destination)` renders as its text, which is what the anchor is made of.
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's ATX headings, a repeated one numbered `-1`, `-2`, ... as
/// GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in without_fences(text).lines() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let line = line.trim_start_matches(' ');
        let level = line.chars().take_while(|c| *c == '#').count();
        if indent > 3 || !(1..=6).contains(&level) {
            continue;
        }
        let rest = &line[level..];
        if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
            continue;
        }
        // An optional closing sequence of `#`s, after a space, is not part of the heading.
        let mut heading = rest.trim();
        let stripped = heading.trim_end_matches('#');
        if stripped.is_empty() || stripped.ends_with([' ', '\t']) {
            heading = stripped.trim_end();
        }
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// `%XX` escapes decoded, as a browser decodes a link before following it.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` resolved without the file system, or `None` when it leaves the
/// repository.
fn normalized(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every broken relative link of `document` (a path relative to the repository's root) whose
/// text is `text`, as `file:line: (link): reason`; `read` looks the targets up.
fn broken_links(document: &Path, text: &str, read: &dyn Fn(&Path) -> Target) -> Vec<String> {
    let mut problems = Vec::new();
    let directory = document.parent().unwrap_or_else(|| Path::new(""));
    for (line, link) in links(text) {
        let lower = link.to_ascii_lowercase();
        if ["http://", "https://", "mailto:"]
            .iter()
            .any(|scheme| lower.starts_with(scheme))
        {
            continue;
        }
        let mut report = |reason: String| {
            problems.push(format!("{}:{line}: ({link}): {reason}", document.display()));
        };
        if link.is_empty() {
            report("empty link".to_owned());
            continue;
        }
        if link.contains("://") {
            report("only http(s) addresses may be absolute".to_owned());
            continue;
        }
        let (path, anchor) = link
            .split_once('#')
            .map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
        let path = percent_decoded(path);
        // GitHub resolves `/x` from the repository's root, anything else from the file's folder.
        let joined = match path.strip_prefix('/') {
            Some(from_root) => PathBuf::from(from_root),
            None if path.is_empty() => document.to_path_buf(),
            None => directory.join(&path),
        };
        let Some(target) = normalized(&joined) else {
            report("points outside the repository".to_owned());
            continue;
        };
        let contents = if target == document {
            Target::File(text.to_owned())
        } else {
            read(&target)
        };
        let Some(anchor) = anchor else {
            if matches!(contents, Target::Missing) {
                report(format!("{} does not exist", target.display()));
            }
            continue;
        };
        let anchor = percent_decoded(anchor);
        match contents {
            Target::Missing => report(format!("{} does not exist", target.display())),
            Target::Directory => report(format!(
                "{} is a directory, it has no #{anchor}",
                target.display()
            )),
            Target::File(_) if target.extension().is_none_or(|extension| extension != "md") => {
                report(format!(
                    "{} is not Markdown, so it has no heading #{anchor}",
                    target.display()
                ));
            }
            Target::File(contents) => {
                if !anchors(&contents).contains(&anchor) {
                    report(format!("{} has no heading #{anchor}", target.display()));
                }
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let documents = match documents() {
        Ok(documents) => documents,
        Err(error) => panic!("{error}"),
    };
    assert!(
        documents.len() > 1,
        "docs/ holds no Markdown page: {documents:?}"
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for document in &documents {
        let Target::File(text) = read_from_disk(document) else {
            problems.push(format!("{}: cannot be read", document.display()));
            continue;
        };
        checked += links(&text).len();
        problems.extend(broken_links(document, &text, &read_from_disk));
    }
    assert!(
        checked > 0,
        "no link found in {documents:?}: the parser is broken"
    );
    assert!(
        problems.is_empty(),
        "{} broken link(s) in the documentation:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checker itself: it reports what is broken and only that, on a small made-up tree.
#[test]
fn a_broken_link_is_reported_and_a_good_one_is_not() {
    let tree: BTreeMap<PathBuf, Target> = [
        (
            "docs/page.md",
            Target::File("# Page\n\n## Two words, and (more)\n\n## Two words, and (more)\n".into()),
        ),
        ("docs/data.txt", Target::File(String::new())),
        ("deploy", Target::Directory),
    ]
    .into_iter()
    .map(|(path, target)| (PathBuf::from(path), target))
    .collect();
    let read = |path: &Path| tree.get(path).cloned().unwrap_or(Target::Missing);
    let readme = "\
# Title

## A `code` heading

Good: [page](docs/page.md), [anchor](docs/page.md#two-words-and-more), [again](docs/page.md#two-words-and-more-1),
[here](#a-code-heading), [folder](deploy/), [data](docs/data.txt), [web](https://example.com/#x),
![image](docs/data.txt \"a title\"), `[code](not/checked.md)`,

```text
[fenced](not/checked/either.md)
```

[ref]: docs/page.md#page
Bad: [gone](docs/missing.md), [no heading](docs/page.md#two-words), [third](docs/page.md#two-words-and-more-2),
[self](#nowhere), [up](../../outside.md), [text anchor](docs/data.txt#L1), [dir anchor](deploy#x).

[badref]: docs/nothing.md
";
    let problems = broken_links(Path::new("README.md"), readme, &read);
    let expected = [
        "README.md:14: (docs/missing.md): docs/missing.md does not exist",
        "README.md:14: (docs/page.md#two-words): docs/page.md has no heading #two-words",
        "README.md:14: (docs/page.md#two-words-and-more-2): docs/page.md has no heading #two-words-and-more-2",
        "README.md:15: (#nowhere): README.md has no heading #nowhere",
        "README.md:15: (../../outside.md): points outside the repository",
        "README.md:15: (docs/data.txt#L1): docs/data.txt is not Markdown, so it has no heading #L1",
        "README.md:15: (deploy#x): deploy is a directory, it has no #x",
        "README.md:17: (docs/nothing.md): docs/nothing.md does not exist",
    ];
    assert_eq!(problems, expected, "{problems:#?}");
}

#[test]
fn anchors_follow_githubs_rules() {
    let text = "\
# masq
## IPsec (XFRM) policies
### `masq explain [--source IP] [--output json] IP...`
## What the DaemonSet does on a node, and why
## The datapath programs' own time (BPF_PROG_TEST_RUN)
## New flows/s, table full
## Closed heading ##
## See [the page](other.md) now
#not-a-heading
    # indented code, not a heading
```sh
# a comment in a fence
```
## masq
";
    let expected: BTreeSet<String> = [
        "masq",
        "ipsec-xfrm-policies",
        "masq-explain---source-ip---output-json-ip",
        "what-the-daemonset-does-on-a-node-and-why",
        "the-datapath-programs-own-time-bpf_prog_test_run",
        "new-flowss-table-full",
        "closed-heading",
        "see-the-page-now",
        "masq-1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(anchors(text), expected);
}
