//! Python `str` methods and Jinja2 filters that minijinja (with minijinja-contrib's pycompat)
//! lacks, so a template calling them renders as in transformers instead of failing: `ljust`,
//! `rjust`, `center`, `zfill`, `swapcase`, `index`, `rindex`, `partition`, `rpartition`,
//! `removeprefix`, `removesuffix`; the `center` and `wordcount` filters. Widths and positions
//! count characters, as Python does.

use minijinja::value::{from_args, Tuple, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};

/// Registers the filters and the method callback on `env`.
pub fn install(env: &mut Environment<'static>) {
    env.set_unknown_method_callback(unknown_method);
    env.add_filter("center", |s: String, width: Option<usize>| {
        center(&s, width.unwrap_or(80), ' ')
    });
    // Jinja2: the number of `\w+` runs.
    env.add_filter("wordcount", |s: String| {
        let mut count = 0;
        let mut in_word = false;
        for c in s.chars() {
            let word = c.is_alphanumeric() || c == '_';
            count += usize::from(word && !in_word);
            in_word = word;
        }
        count
    });
}

/// The methods below for strings, else pycompat's.
fn unknown_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (ValueKind::String, Some(s)) = (value.kind(), value.as_str()) {
        if let Some(rv) = str_method(s, method, args) {
            return rv;
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

fn str_method(s: &str, method: &str, args: &[Value]) -> Option<Result<Value, Error>> {
    let rv =
        match method {
            "ljust" | "rjust" | "center" => justify(s, method, args),
            "zfill" => from_args(args).map(|(width,): (usize,)| zfill(s, width).into()),
            "swapcase" => from_args(args).map(|()| swapcase(s).into()),
            "index" | "rindex" => from_args(args).and_then(|(sub,): (String,)| {
                let at = if method == "index" {
                    s.find(&sub)
                } else {
                    s.rfind(&sub)
                };
                match at {
                    Some(byte) => Ok(Value::from(s[..byte].chars().count())),
                    None => Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "ValueError: substring not found",
                    )),
                }
            }),
            "partition" | "rpartition" => from_args(args).map(|(sep,): (String,)| {
                let split = if method == "partition" {
                    s.split_once(&sep)
                } else {
                    s.rsplit_once(&sep)
                };
                let parts = match (split, method) {
                    (Some((a, b)), _) => [a, sep.as_str(), b],
                    (None, "partition") => [s, "", ""],
                    (None, _) => ["", "", s],
                };
                Value::from_object(Tuple::from(parts.map(Value::from)))
            }),
            "removeprefix" => from_args(args)
                .map(|(p,): (String,)| s.strip_prefix(p.as_str()).unwrap_or(s).into()),
            "removesuffix" => from_args(args)
                .map(|(p,): (String,)| s.strip_suffix(p.as_str()).unwrap_or(s).into()),
            _ => return None,
        };
    Some(rv)
}

fn justify(s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    let (width, fill): (usize, Option<String>) = from_args(args)?;
    let fill = match fill.as_deref().map(|f| {
        let mut cs = f.chars();
        (cs.next(), cs.next())
    }) {
        None => ' ',
        Some((Some(c), None)) => c,
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "TypeError: The fill character must be exactly one character long",
            ))
        }
    };
    let len = s.chars().count();
    let pad = width.saturating_sub(len);
    let fills = |n: usize| std::iter::repeat_n(fill, n).collect::<String>();
    Ok(Value::from(match method {
        "ljust" => format!("{s}{}", fills(pad)),
        "rjust" => format!("{}{s}", fills(pad)),
        _ => center(s, width, fill),
    }))
}

/// Python's `str.center`: the odd cell goes left when the width is odd.
fn center(s: &str, width: usize, fill: char) -> String {
    let pad = width.saturating_sub(s.chars().count());
    let left = pad / 2 + (pad & width & 1);
    let fills = |n: usize| std::iter::repeat_n(fill, n).collect::<String>();
    format!("{}{s}{}", fills(left), fills(pad - left))
}

fn zfill(s: &str, width: usize) -> String {
    let pad = width.saturating_sub(s.chars().count());
    let (sign, digits) = match s.strip_prefix(['+', '-']) {
        Some(rest) => (&s[..1], rest),
        None => ("", s),
    };
    format!("{sign}{}{digits}", "0".repeat(pad))
}

fn swapcase(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_uppercase() {
                c.to_lowercase().collect::<Vec<_>>()
            } else {
                c.to_uppercase().collect::<Vec<_>>()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::{ChatTemplate, Message, RenderOptions, TemplateOrigin};

    fn render(source: &str) -> String {
        let t = ChatTemplate::new(source, TemplateOrigin::Builtin("t"), None, None).unwrap();
        t.render(&[Message::user("hi")], &RenderOptions::default())
            .unwrap()
    }

    #[test]
    fn string_methods_as_python() {
        // Expected strings: Python 3.11.
        assert_eq!(
            render("{{ 'ab'.ljust(5, '.') }}|{{ 'ab'.rjust(4) }}|{{ 'ab'.center(5, '*') }}|{{ 'abc'.center(6, '*') }}|{{ '-7'.zfill(4) }}"),
            "ab...|  ab|**ab*|*abc**|-007"
        );
        assert_eq!(
            render("{{ 'HeLLo'.swapcase() }}|{{ 'aébc'.index('b') }}|{{ 'abcb'.rindex('b') }}|{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'abc'.partition('x') }}"),
            "hEllO|2|3|('a', '=', 'b=c')|('a=b', '=', 'c')|('abc', '', '')"
        );
        assert_eq!(
            render("{{ 'prefix_x'.removeprefix('prefix_') }}|{{ 'x.txt'.removesuffix('.txt') }}|{{ 'x' | center(5) }}|{{ 'a b_c, d' | wordcount }}"),
            "x|x|  x  |3"
        );
        // Methods pycompat has still work.
        assert_eq!(
            render("{{ ' a '.strip() }}|{{ {'k': 1}.items() | list }}"),
            "a|[('k', 1)]"
        );
    }
}
