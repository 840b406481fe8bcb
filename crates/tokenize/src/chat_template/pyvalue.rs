//! Python-Jinja value semantics that minijinja does not share, so a template fails or branches
//! where transformers' does: none is not iterable (a `for` over it raises, `is iterable` is
//! false), and `map` / `select` / `reject` / `selectattr` / `rejectattr` yield generators, which
//! iterate and `|list` as usual but have no `length` and which `tojson` refuses.

use std::borrow::Cow;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr, Rest, ValueOrKwargs};
use minijinja::{filters, Environment, Error, ErrorKind, State, Value};

use super::rewrite::PY_ITER;

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
    env.add_filter(
        "map",
        |state: &mut State, v: Value, args: Rest<ValueOrKwargs>| {
            filters::map(state, v, args).map(Generator::value)
        },
    );
    env.add_filter(
        "select",
        |state: &mut State, v: Value, test: Option<String>, args: Rest<ValueOrKwargs>| {
            filters::select(state, v, test.map(Cow::Owned), args).map(Generator::value)
        },
    );
    env.add_filter(
        "reject",
        |state: &mut State, v: Value, test: Option<String>, args: Rest<ValueOrKwargs>| {
            filters::reject(state, v, test.map(Cow::Owned), args).map(Generator::value)
        },
    );
    env.add_filter(
        "selectattr",
        |state: &mut State,
         v: Value,
         attr: String,
         test: Option<String>,
         args: Rest<ValueOrKwargs>| {
            filters::selectattr(state, v, Cow::Owned(attr), test.map(Cow::Owned), args)
                .map(Generator::value)
        },
    );
    env.add_filter(
        "rejectattr",
        |state: &mut State,
         v: Value,
         attr: String,
         test: Option<String>,
         args: Rest<ValueOrKwargs>| {
            filters::rejectattr(state, v, Cow::Owned(attr), test.map(Cow::Owned), args)
                .map(Generator::value)
        },
    );
}

/// What every `for` loop's iterable passes through: Python's `iter()` refuses None.
fn py_iter(v: Value) -> Result<Value, Error> {
    if v.is_none() {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            "'NoneType' object is not iterable",
        ))
    } else {
        Ok(v)
    }
}

/// The result of a Jinja filter that is a Python generator.
#[derive(Debug)]
pub struct Generator(Vec<Value>);

impl Generator {
    fn value(items: Vec<Value>) -> Value {
        Value::from_object(Generator(items))
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
