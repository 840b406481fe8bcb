//! Source rewrites that give minijinja two of Python-Jinja's statement semantics it lacks:
//! transformers' `{% generation %}…{% endgeneration %}` tag (it marks the assistant's text for
//! training masks and renders its body in place, in a scope of its own) becomes a `with` block,
//! and a `for` loop's iterable goes through [`PY_ITER`], so looping over none raises as Python
//! does. Tags are found by scanning Jinja's syntax (text, comments, raw blocks, string literals,
//! brackets), so text that only looks like a tag is left alone.

/// The filter every `for` loop's iterable is passed through (see `pyiter` in `mod.rs`).
pub const PY_ITER: &str = "__anelm_pyiter";

/// The source with both rewrites applied.
pub fn rewrite(source: &str) -> String {
    let bytes = source.as_bytes();
    // (byte range to replace, replacement), in source order.
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let mut pos = 0;
    while let Some(open) = find(bytes, pos, b"{") {
        match bytes.get(open + 1) {
            Some(b'#') => pos = find(bytes, open + 2, b"#}").map_or(bytes.len(), |e| e + 2),
            Some(b'{') => pos = tag_end(bytes, open + 2, b"}}"),
            Some(b'%') => {
                let name_at = skip_space(bytes, skip_sign(bytes, open + 2));
                let name_end = ident_end(bytes, name_at);
                let end = tag_end(bytes, name_end, b"%}");
                pos = end;
                match &source[name_at..name_end] {
                    "raw" => pos = raw_end(bytes, pos),
                    name @ ("generation" | "endgeneration") => {
                        let close = skip_sign(bytes, skip_space(bytes, name_end));
                        if bytes[close..].starts_with(b"%}") {
                            let with = if name == "generation" {
                                "with"
                            } else {
                                "endwith"
                            };
                            // Padded, so byte offsets (and error positions) stay put.
                            let padded = format!("{with:<width$}", width = name.len());
                            edits.push((name_at..name_end, padded));
                        }
                    }
                    "for" => {
                        if let Some(iter) = for_iterable(bytes, name_end, end) {
                            edits.push((iter.start..iter.start, "(".into()));
                            edits.push((iter.end..iter.end, format!(")|{PY_ITER} ")));
                        }
                    }
                    _ => {}
                }
            }
            _ => pos = open + 1,
        }
    }
    let mut out = String::with_capacity(source.len() + 32 * edits.len());
    let mut at = 0;
    for (range, text) in edits {
        // An unclosed tag can end inside what an edit covers: such an edit is dropped (the
        // template is malformed anyway, and minijinja says where).
        let whole = |i: usize| source.is_char_boundary(i);
        if range.start < at || range.end < range.start || !whole(range.start) || !whole(range.end) {
            continue;
        }
        out.push_str(&source[at..range.start]);
        out.push_str(&text);
        at = range.end;
    }
    out.push_str(&source[at..]);
    out
}

/// The iterable of a `for` tag whose inside runs from `from` to the tag's end `end` (just past
/// `%}`): from after the first top-level `in` to the first top-level `if` / `recursive` (Jinja's
/// iterable has no conditional expression, so a top-level `if` starts the loop filter) or the
/// tag's close. None when the tag has no `in` (a syntax error either way).
fn for_iterable(bytes: &[u8], from: usize, end: usize) -> Option<std::ops::Range<usize>> {
    let close = end.checked_sub(2)?;
    let close = if matches!(
        close.checked_sub(1).and_then(|i| bytes.get(i)),
        Some(b'-' | b'+')
    ) {
        close - 1
    } else {
        close
    };
    let mut start = None;
    let mut at = from;
    let mut depth = 0usize;
    while at < close {
        match bytes[at] {
            b'\'' | b'"' => at = string_end(bytes, at),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b if depth == 0 && (b.is_ascii_alphabetic() || b == b'_') => {
                let word_end = ident_end(bytes, at);
                let after_dot = at > 0 && bytes[at - 1] == b'.';
                match (&bytes[at..word_end], start) {
                    (b"in", None) if !after_dot => start = Some(word_end),
                    (b"if" | b"recursive", Some(s)) if !after_dot && s <= at => return Some(s..at),
                    _ => {}
                }
                at = word_end;
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    // A word that runs into an unclosed tag's end can put the start past the close.
    start.filter(|&s| s <= close).map(|s| s..close)
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    let hay = bytes.get(from..)?;
    memchr::memmem::find(hay, needle).map(|i| from + i)
}

fn skip_sign(bytes: &[u8], at: usize) -> usize {
    match bytes.get(at) {
        Some(b'-' | b'+') => at + 1,
        _ => at,
    }
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

fn ident_end(bytes: &[u8], mut at: usize) -> usize {
    while bytes
        .get(at)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
    {
        at += 1;
    }
    at
}

/// The position of the closing quote of the string literal opening at `at`.
fn string_end(bytes: &[u8], mut at: usize) -> usize {
    let quote = bytes[at];
    at += 1;
    while at < bytes.len() && bytes[at] != quote {
        at += if bytes[at] == b'\\' { 2 } else { 1 };
    }
    at.min(bytes.len())
}

/// Just past the `end` (`}}` or `%}`) that closes a tag whose inside starts at `at`: string
/// literals skipped, and an `end` inside brackets is not the end (as Jinja's lexer balances them).
fn tag_end(bytes: &[u8], mut at: usize, end: &[u8]) -> usize {
    let mut depth = 0usize;
    while at < bytes.len() {
        match bytes[at] {
            b'\'' | b'"' => at = string_end(bytes, at),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b'}' if depth > 0 => depth -= 1,
            _ if depth == 0 && bytes[at..].starts_with(end) => return at + end.len(),
            _ => {}
        }
        at += 1;
    }
    bytes.len()
}

/// Just past the `{% endraw %}` that closes a raw block whose text starts at `at`.
fn raw_end(bytes: &[u8], mut at: usize) -> usize {
    while let Some(open) = find(bytes, at, b"{%") {
        let name_at = skip_space(bytes, skip_sign(bytes, open + 2));
        if bytes[name_at..ident_end(bytes, name_at)] == *b"endraw" {
            return tag_end(bytes, name_at, b"%}");
        }
        at = open + 2;
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::{rewrite, PY_ITER};

    /// Found by the fuzzer: an unclosed `for` tag whose `in` runs into the end of the source.
    #[test]
    fn an_unclosed_for_tag_is_left_to_minijinja() {
        let src = "{{ bos_token }}{% for{% for message in messages %}{% if loop.first and messages[0];'r moleessa'] != ge in ";
        let out = rewrite(src);
        assert!(out.starts_with("{{ bos_token }}"), "{out}");
        // And one whose unclosed tag ends inside a multi-byte character.
        let src2 = "{% for message in if messs %}{% for message in\u{16}ages[0]['% for mess}[os\u{422}\u{616}}}\u{616}}}ys4444agef %}}[os\u{422}\u{616}}}\u{616}}";
        let _ = rewrite(src2);
        for cut in 0..src.len() {
            if src.is_char_boundary(cut) {
                let _ = rewrite(&src[..cut]);
            }
        }
    }

    #[test]
    fn generation_tags_become_with_blocks_in_place() {
        let src = "{%- generation -%}{{ m.content }}{%+ endgeneration %}";
        let want = "{%- with       -%}{{ m.content }}{%+ endwith       %}";
        assert_eq!(rewrite(src), want);
    }

    #[test]
    fn for_iterables_go_through_pyiter() {
        let p = PY_ITER;
        for (src, want) in [
            (
                "{% for m in messages %}",
                format!("{{% for m in( messages )|{p} %}}"),
            ),
            (
                "{%- for k, v in x.items() if k != 'in' recursive -%}",
                format!("{{%- for k, v in( x.items() )|{p} if k != 'in' recursive -%}}"),
            ),
            (
                "{% for (a, b) in [('if', 1)] + y.recursive if a %}",
                format!("{{% for (a, b) in( [('if', 1)] + y.recursive )|{p} if a %}}"),
            ),
        ] {
            assert_eq!(rewrite(src), want, "{src}");
        }
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_kept() {
        for src in [
            "{{ '{% generation %}{% for x in y %}' }}",
            "{{ \"a\\\"{% generation %}\" }}",
            "{# {% generation %} {% for x in y %} #}",
            "{% raw %}{% generation %}{% for x in y %}{% endraw %}",
            "{% set x = '%}{% generation %}' %}",
            "{{ {'a': {'b': '}}{% generation %}'}} }}",
            "{% generation_x %}",
            "{% generation x %}",
            "{% for %}",
            "generation for x in y",
        ] {
            assert_eq!(rewrite(src), src, "{src}");
        }
        assert_eq!(
            rewrite("{% raw %}x{%- endraw %}{% generation %}"),
            "{% raw %}x{%- endraw %}{% with       %}"
        );
    }
}
