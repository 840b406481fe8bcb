//! Values printed as Jinja2 prints them, which is Python's `str()`: `None`, `True`/`False`,
//! floats as Python's repr, lists and dicts as Python literals (`[{'type': 'text'}]`). Templates
//! that print a list where they expect a string (content parts given to a text-only template)
//! then produce the bytes transformers produces.

use minijinja::value::ValueKind;
use minijinja::{Error, Value};

use super::pyjson::python_float_repr;

/// Python's `str(value)`.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => py_repr(v),
    }
}

/// Python's `repr(value)`.
fn py_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number if !v.is_integer() => {
            f64::try_from(v.clone()).map_or_else(|_| v.to_string(), python_float_repr)
        }
        ValueKind::String => repr_str(v.as_str().unwrap_or_default()),
        ValueKind::Seq if v.is_tuple() => match v.try_iter() {
            Ok(items) => {
                let items: Vec<String> = items.map(|i| py_repr(&i)).collect();
                let comma = if items.len() == 1 { "," } else { "" };
                format!("({}{comma})", items.join(", "))
            }
            Err(_) => v.to_string(),
        },
        ValueKind::Seq | ValueKind::Iterable => match v.try_iter() {
            Ok(items) => format!(
                "[{}]",
                items.map(|i| py_repr(&i)).collect::<Vec<_>>().join(", ")
            ),
            Err(_) => v.to_string(),
        },
        ValueKind::Map => match v.try_iter() {
            Ok(keys) => {
                let entries: Vec<String> = keys
                    .map(|k| {
                        let val = v.get_item(&k).unwrap_or_default();
                        format!("{}: {}", py_repr(&k), py_repr(&val))
                    })
                    .collect();
                format!("{{{}}}", entries.join(", "))
            }
            Err(_) => v.to_string(),
        },
        _ => v.to_string(),
    }
}

/// Python's string repr: single quotes unless the text has `'` and no `"`.
fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Jinja2's `trim` filter: `str(value)` stripped of whitespace (or of `chars`).
pub fn trim(v: &Value, chars: Option<String>) -> String {
    let s = py_str(v);
    match chars {
        Some(cs) => s.trim_matches(|c| cs.contains(c)).to_string(),
        None => s.trim().to_string(),
    }
}

/// Jinja2's `string` filter.
pub fn string(v: &Value) -> String {
    py_str(v)
}

/// The environment's formatter: how `{{ value }}` prints.
pub fn format(
    out: &mut minijinja::Output,
    _state: &mut minijinja::State,
    v: &Value,
) -> Result<(), Error> {
    out.write_str(&py_str(v)).map_err(Error::from)
}

/// Python's `t0 + t1 + …` where some term is a `Markup` (a `|safe` string; see
/// `rewrite::MARKUP_ADD`): markupsafe's `Markup.__add__` / `__radd__` escape each plain string
/// (`&<>'"`) and keep the safe ones, and take nothing but strings — Python's `+` raises a
/// TypeError for a Markup and a number, none or undefined.
pub fn markup_add(terms: &[Value]) -> Result<Value, Error> {
    let mut out = String::new();
    for t in terms {
        match (t.kind(), t.as_str()) {
            (ValueKind::String, Some(s)) if t.is_safe() => out.push_str(s),
            (ValueKind::String, Some(s)) => escape_html(s, &mut out),
            _ => {
                return Err(Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!(
                        "unsupported operand type(s) for +: 'Markup' and '{}'",
                        t.kind()
                    ),
                ))
            }
        }
    }
    Ok(Value::from_safe_string(out))
}

/// markupsafe's `escape` of a string.
fn escape_html(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_markup_sum_escapes_what_is_not_safe() {
        let terms = [
            Value::from_safe_string("<b>'".into()),
            Value::from("a \"<&>' b"),
            Value::from_safe_string("<i>".into()),
        ];
        let v = markup_add(&terms).unwrap();
        assert!(v.is_safe());
        assert_eq!(v.as_str(), Some("<b>'a &#34;&lt;&amp;&gt;&#39; b<i>"));
        let radd = markup_add(&[Value::from("<"), Value::from_safe_string("b".into())]).unwrap();
        assert_eq!(radd.as_str(), Some("&lt;b"));
        assert!(markup_add(&[Value::from_safe_string("x".into()), Value::from(1)]).is_err());
        assert!(markup_add(&[Value::from_safe_string("x".into()), Value::UNDEFINED]).is_err());
    }

    #[test]
    fn prints_as_python() {
        let v: Value = Value::deserialize(
            serde_json::json!([{"type": "text", "text": "it's"}, null, true, 1, 2.5, "a\"b"]),
        )
        .unwrap();
        assert_eq!(
            py_str(&v),
            r#"[{'type': 'text', 'text': "it's"}, None, True, 1, 2.5, 'a"b']"#
        );
        assert_eq!(py_str(&Value::from(1.0f64)), "1.0");
        assert_eq!(trim(&Value::from("  x \n"), None), "x");
        assert_eq!(trim(&Value::from("xxaxx"), Some("x".into())), "a");
    }

    use serde::Deserialize;
}
