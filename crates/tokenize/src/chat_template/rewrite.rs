//! Source rewrites that give minijinja three of Python-Jinja's semantics it lacks:
//! transformers' `{% generation %}…{% endgeneration %}` tag (it marks the assistant's text for
//! training masks and renders its body in place, in a scope of its own) becomes a `with` block;
//! a `for` loop's iterable goes through [`PY_ITER`], so looping over none raises as Python
//! does; and a printed sum whose first term is `…|safe` goes through [`MARKUP_ADD`], as in
//! Python `Markup + str` HTML-escapes the str (markupsafe, whatever the autoescape setting).
//! Tags are found by scanning Jinja's syntax (text, comments, raw blocks, string literals,
//! brackets), so text that only looks like a tag is left alone.

/// The filter every `for` loop's iterable is passed through (see `pyiter` in `mod.rs`).
pub const PY_ITER: &str = "__anelm_pyiter";

/// The function a printed `a|safe + b + …` becomes (see `markup_add` in `pystr.rs`).
pub const MARKUP_ADD: &str = "__anelm_markup_add";

/// The source with both rewrites applied.
pub fn rewrite(source: &str) -> String {
    let bytes = source.as_bytes();
    // (byte range to replace, replacement), in source order.
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let mut pos = 0;
    while let Some(open) = find(bytes, pos, b"{") {
        match bytes.get(open + 1) {
            Some(b'#') => pos = find(bytes, open + 2, b"#}").map_or(bytes.len(), |e| e + 2),
            Some(b'{') => {
                pos = tag_end(bytes, open + 2, b"}}");
                let inner = skip_sign(bytes, open + 2)..inner_close(bytes, pos);
                if let Some(terms) = markup_sum(bytes, inner) {
                    // `t0 + t1 + …` → `f(t0 , t1 , …)`: each `+` becomes a comma in place.
                    let first = skip_space(bytes, terms[0].start);
                    edits.push((first..first, format!("{MARKUP_ADD}(")));
                    for t in &terms[1..] {
                        edits.push((t.start - 1..t.start, ",".into()));
                    }
                    let last = terms[terms.len() - 1].end;
                    edits.push((last..last, ")".into()));
                }
            }
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

/// Where the inside of a tag that ends just before `end` (past its `}}` / `%}`) closes: before
/// the close and its whitespace-control sign.
fn inner_close(bytes: &[u8], end: usize) -> usize {
    let close = end.saturating_sub(2);
    match close.checked_sub(1).and_then(|i| bytes.get(i)) {
        Some(b'-' | b'+') => close - 1,
        _ => close,
    }
}

/// The terms of a printed expression that is a sum and nothing else at its top level — terms
/// joined by `+` (each with its filters, calls, subscripts and brackets), no other operator or
/// keyword — one of whose terms ends in the `safe` filter: a Python sum with a `Markup` in it
/// (see [`MARKUP_ADD`]). Each term's range is its bytes between the `+` signs, with the `+` just
/// before every term but the first. None for every other expression.
fn markup_sum(bytes: &[u8], inner: std::ops::Range<usize>) -> Option<Vec<std::ops::Range<usize>>> {
    let mut terms = Vec::new();
    let mut term_start = inner.start;
    let mut depth = 0usize;
    let mut at = inner.start;
    let mut prev = b' ';
    while at < inner.end.min(bytes.len()) {
        let b = bytes[at];
        match b {
            b'\'' | b'"' => at = string_end(bytes, at),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.checked_sub(1)?,
            _ if depth > 0 || b.is_ascii_whitespace() || b.is_ascii_digit() => {}
            b'+' => {
                terms.push(term_start..at);
                term_start = at + 1;
            }
            b'|' | b'.' => {}
            _ if b.is_ascii_alphabetic() || b == b'_' => {
                let word_end = ident_end(bytes, at);
                let keyword = matches!(
                    &bytes[at..word_end],
                    b"if" | b"else" | b"and" | b"or" | b"not" | b"in" | b"is"
                );
                // A filter's or an attribute's name is no keyword.
                if keyword && !matches!(prev, b'|' | b'.') {
                    return None;
                }
                prev = b'a';
                at = word_end;
                continue;
            }
            // Any other operator (`-`, `*`, `~`, comparisons, `,`, `:`, …) at the top level.
            _ => return None,
        }
        if !b.is_ascii_whitespace() {
            prev = b;
        }
        at += 1;
    }
    if depth != 0 || terms.is_empty() {
        return None;
    }
    terms.push(term_start..inner.end);
    terms
        .iter()
        .any(|t| std::str::from_utf8(&bytes[t.clone()]).is_ok_and(ends_safe))
        .then_some(terms)
}

/// Whether a term's last filter is `safe` (`x|safe`, `x | safe()`, `(x | safe)`).
fn ends_safe(term: &str) -> bool {
    let mut t = term.trim();
    loop {
        let bare = t.strip_suffix("()").unwrap_or(t).trim_end();
        if bare
            .strip_suffix("safe")
            .is_some_and(|rest| rest.trim_end().ends_with('|'))
        {
            return true;
        }
        // One pair of brackets around the whole term.
        match t.strip_prefix('(').and_then(|i| i.strip_suffix(')')) {
            Some(inner) if balanced(inner) => t = inner.trim(),
            _ => return false,
        }
    }
}

/// Brackets outside string literals never close below depth 0.
fn balanced(s: &str) -> bool {
    let b = s.as_bytes();
    let (mut depth, mut at) = (0usize, 0);
    while at < b.len() {
        match b[at] {
            b'\'' | b'"' => at = string_end(b, at),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => {}
        }
        at += 1;
    }
    depth == 0
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
    use super::{rewrite, MARKUP_ADD, PY_ITER};

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
    fn a_printed_sum_from_a_safe_string_becomes_a_markup_sum() {
        let f = MARKUP_ADD;
        for (src, want) in [
            (
                "{{ \"a '\"|safe + t['name'] + \"'\"|safe + t | tojson() }}",
                format!("{{{{ {f}(\"a '\"|safe , t['name'] , \"'\"|safe , t | tojson() )}}}}"),
            ),
            (
                "{{- 'x'|safe() + (a + b) -}}",
                format!("{{{{- {f}('x'|safe() , (a + b) )-}}}}"),
            ),
        ] {
            assert_eq!(rewrite(src), want, "{src}");
        }
        assert_eq!(
            rewrite("{{ '<' + ('b' | safe) }}"),
            format!("{{{{ {f}('<' , ('b' | safe) )}}}}")
        );
        // Sums without a safe string, or that are not sums alone, are left alone.
        for src in [
            "{{ a + 'x' }}",
            "{{ a + ('x'|safe)|upper }}",
            "{{ 'x'|safe }}",
            "{{ 'x'|safe + a if c else b }}",
            "{{ 'x'|safe + a ~ b }}",
            "{{ 'x'|safe + a - 1 }}",
            "{{ 'x'|unsafe + a }}",
            "{{ 'x'|safe + a is defined }}",
            "{{ ('x'|safe + a) }}",
            "{% set y = 'x'|safe + a %}",
        ] {
            assert_eq!(rewrite(src), src, "{src}");
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
