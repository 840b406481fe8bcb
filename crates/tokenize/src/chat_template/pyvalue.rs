//! Python-Jinja value semantics that minijinja does not share, so a template fails or branches
//! where transformers' does: none is not iterable (a `for` over it or a filter that iterates
//! raises, `is iterable` is false), and the filters that return generators in Jinja2 (`map`,
//! `select`, `reject`, `selectattr`, `rejectattr`, `unique`, `items`, `batch`, `slice`, and
//! `reverse` of a non-string) iterate and `|list` as usual but have no `length` and `tojson`
//! refuses them.

use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectExt, ObjectRepr, Rest};
use minijinja::{filters, Environment, Error, ErrorKind, State, Value};

use super::rewrite::PY_ITER;

/// Registers `$name` as minijinja's filter `$original` with Python's treatment of none (`$none`:
/// refused as Python cannot iterate it, or an empty generator as Jinja2's `map` and `select`
/// family give) and its result through `$post`; the original stays under a hidden name.
macro_rules! python_filter {
    ($env:expr, $name:literal, $original:expr, $none:expr, $post:expr) => {{
        const HIDDEN: &str = concat!("__anelm_builtin_", $name);
        $env.add_filter(HIDDEN, $original);
        $env.add_filter(
            $name,
            |state: &mut State,
             v: Value,
             args: Rest<Value>,
             kwargs: Kwargs|
             -> Result<Value, Error> {
                if v.is_none() {
                    return $none;
                }
                let mut all = Vec::with_capacity(args.len() + 2);
                all.push(v);
                all.extend(args.0);
                // Passed on as keyword arguments (each read here, so none counts as unused).
                let keys: Vec<String> = kwargs.args().map(str::to_string).collect();
                if !keys.is_empty() {
                    let mut pairs = Vec::with_capacity(keys.len());
                    for k in keys {
                        let v: Value = kwargs.get(&k)?;
                        pairs.push((k, v));
                    }
                    all.push(Value::from(Kwargs::from_iter(pairs)));
                }
                state.apply_filter(HIDDEN, &all).map($post)
            },
        );
    }};
}

/// Registers the filters and tests of this module on `env`.
pub fn install(env: &mut Environment<'static>) {
    env.add_filter(PY_ITER, py_iter);
    env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
    for name in ["length", "count"] {
        env.add_filter(name, |v: &Value| -> Result<Value, Error> {
            if Generator::is(v) {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "object of type 'generator' has no len()",
                ));
            }
            filters::length(v).map(Value::from)
        });
    }
    python_filter!(env, "join", filters::join, Err(not_iterable()), same);
    python_filter!(env, "list", filters::list, Err(not_iterable()), same);
    python_filter!(env, "sort", filters::sort, Err(not_iterable()), same);
    python_filter!(
        env,
        "dictsort",
        filters::dictsort,
        Err(not_iterable()),
        same
    );
    python_filter!(env, "first", filters::first, Err(not_iterable()), same);
    python_filter!(env, "last", filters::last, Err(not_iterable()), same);
    python_filter!(env, "sum", filters::sum, Err(not_iterable()), same);
    python_filter!(env, "min", filters::min, Err(not_iterable()), same);
    python_filter!(env, "max", filters::max, Err(not_iterable()), same);
    // Python's reversed() of a string is a string, of anything else an iterator.
    python_filter!(
        env,
        "reverse",
        filters::reverse,
        Err(not_iterable()),
        |v: Value| {
            if v.as_str().is_some() {
                v
            } else {
                Generator::value(v)
            }
        }
    );
    python_filter!(
        env,
        "unique",
        filters::unique,
        Err(not_iterable()),
        Generator::value
    );
    python_filter!(
        env,
        "items",
        filters::items,
        Err(not_iterable()),
        Generator::value
    );
    python_filter!(
        env,
        "batch",
        filters::batch,
        Err(not_iterable()),
        Generator::value
    );
    python_filter!(
        env,
        "slice",
        filters::slice,
        Err(not_iterable()),
        Generator::value
    );
    python_filter!(
        env,
        "map",
        filters::map,
        Ok(Generator::empty()),
        Generator::value
    );
    python_filter!(
        env,
        "select",
        filters::select,
        Ok(Generator::empty()),
        Generator::value
    );
    python_filter!(
        env,
        "reject",
        filters::reject,
        Ok(Generator::empty()),
        Generator::value
    );
    python_filter!(
        env,
        "selectattr",
        filters::selectattr,
        Ok(Generator::empty()),
        Generator::value
    );
    python_filter!(
        env,
        "rejectattr",
        filters::rejectattr,
        Ok(Generator::empty()),
        Generator::value
    );
}

fn same(v: Value) -> Value {
    v
}

/// What every `for` loop's iterable passes through: Python's `iter()` refuses None.
fn py_iter(v: Value) -> Result<Value, Error> {
    if v.is_none() {
        Err(not_iterable())
    } else {
        Ok(v)
    }
}

fn not_iterable() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        "'NoneType' object is not iterable",
    )
}

/// The result of a Jinja filter that is a Python generator.
#[derive(Debug)]
pub struct Generator(Vec<Value>);

impl Generator {
    /// The items of `v` as a generator.
    fn value(v: Value) -> Value {
        let items = v.try_iter().map(|i| i.collect()).unwrap_or_default();
        Value::from_object(Generator(items))
    }

    fn empty() -> Value {
        Value::from_object(Generator(Vec::new()))
    }

    /// Whether `v` is such a result (`json.dumps` refuses generators).
    pub fn is(v: &Value) -> bool {
        v.downcast_object_ref::<Generator>().is_some()
    }
}

impl Object for Generator {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Iterable
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| Box::new(this.0.iter().cloned()))
    }
}

#[cfg(test)]
mod tests {
    use crate::{ChatTemplate, Message, RenderOptions, TemplateOrigin};

    fn render(source: &str) -> Result<String, String> {
        let t = ChatTemplate::new(source, TemplateOrigin::Builtin("t"), None, None).unwrap();
        t.render(&[Message::user("hi")], &RenderOptions::default())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn none_is_not_iterable() {
        assert_eq!(
            render("{{ tools is iterable }}{{ [] is iterable }}{{ 'x' is iterable }}{{ nope is iterable }}{{ 1 is iterable }}")
                .unwrap(),
            "FalseTrueTrueTrueFalse"
        );
        let e = render("{% for t in tools %}{% endfor %}").unwrap_err();
        assert!(e.contains("'NoneType' object is not iterable"), "{e}");
        // An undefined name still loops zero times, as in Jinja2.
        assert_eq!(render("{% for t in nope %}x{% endfor %}.").unwrap(), ".");
    }

    #[test]
    fn filters_that_yield_generators_list_but_do_not_serialize() {
        let src = "{{ messages | map(attribute='role') | list | tojson }}|{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|{% for r in messages | map(attribute='role') %}{{ r }}{% endfor %}";
        assert_eq!(render(src).unwrap(), "[\"user\"]|hi|user");
        let e = render("{{ messages | map(attribute='role') | tojson }}").unwrap_err();
        assert!(e.contains("generator"), "{e}");
        let e = render("{{ messages | select | length }}").unwrap_err();
        assert!(e.contains("no len()"), "{e}");
    }
}
