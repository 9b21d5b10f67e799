//! Attribute values and the ordered attribute dictionary of an op.

use std::borrow::Cow;

use indexmap::IndexMap;

/// One attribute value.
///
/// Equality compares floats by what they print as, not by IEEE `==`: `nan`
/// equals `nan` and `-0.0` differs from `0.0`.
#[derive(Clone, Debug)]
pub enum Attr {
    /// A signed integer.
    Int(i64),
    /// A float, kept as f64 (exact for every float dtype of the IR).
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A list of floats.
    Floats(Vec<f64>),
}

impl PartialEq for Attr {
    fn eq(&self, other: &Attr) -> bool {
        fn same(a: f64, b: f64) -> bool {
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
        }
        match (self, other) {
            (Attr::Int(a), Attr::Int(b)) => a == b,
            (Attr::Float(a), Attr::Float(b)) => same(*a, *b),
            (Attr::Bool(a), Attr::Bool(b)) => a == b,
            (Attr::Str(a), Attr::Str(b)) => a == b,
            (Attr::Ints(a), Attr::Ints(b)) => a == b,
            (Attr::Floats(a), Attr::Floats(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| same(x, y))
            }
            _ => false,
        }
    }
}

/// The kind of value an attribute of the op table must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrKind {
    /// [`Attr::Int`].
    Int,
    /// [`Attr::Float`]; an integer literal is accepted and converted.
    Float,
    /// [`Attr::Bool`].
    Bool,
    /// [`Attr::Str`].
    Str,
    /// [`Attr::Ints`].
    Ints,
    /// [`Attr::Floats`]; an integer list is accepted and converted.
    Floats,
    /// A tensor literal: a number or a list of numbers (used by `constant`).
    Literal,
}

impl AttrKind {
    /// How the kind is described in messages and docs.
    pub fn describe(self) -> &'static str {
        match self {
            AttrKind::Int => "an integer",
            AttrKind::Float => "a float",
            AttrKind::Bool => "a boolean",
            AttrKind::Str => "a string",
            AttrKind::Ints => "a list of integers",
            AttrKind::Floats => "a list of floats",
            AttrKind::Literal => "a number or a list of numbers",
        }
    }
}

impl Attr {
    /// Converts `self` to `kind` where that loses nothing (an integer where a
    /// float is wanted); `None` when the value is not of that kind.
    pub fn coerce(self, kind: AttrKind) -> Option<Attr> {
        match (kind, self) {
            (AttrKind::Int, a @ Attr::Int(_)) => Some(a),
            (AttrKind::Float, a @ Attr::Float(_)) => Some(a),
            (AttrKind::Float, Attr::Int(i)) => Some(Attr::Float(i as f64)),
            (AttrKind::Bool, a @ Attr::Bool(_)) => Some(a),
            (AttrKind::Str, a @ Attr::Str(_)) => Some(a),
            (AttrKind::Ints, a @ Attr::Ints(_)) => Some(a),
            (AttrKind::Floats, a @ Attr::Floats(_)) => Some(a),
            (AttrKind::Floats, Attr::Ints(v)) => {
                Some(Attr::Floats(v.into_iter().map(|i| i as f64).collect()))
            }
            (AttrKind::Literal, a @ (Attr::Int(_) | Attr::Float(_))) => Some(a),
            (AttrKind::Literal, a @ (Attr::Ints(_) | Attr::Floats(_))) => Some(a),
            _ => None,
        }
    }

    /// The integer, if this is [`Attr::Int`].
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The float, if this is [`Attr::Float`].
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Attr::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The one value of a constant's `value` when every element holds it
    /// (a scalar, or a list of bit-identical elements, NaNs included).
    pub fn splat(&self) -> Option<f64> {
        match self {
            Attr::Float(f) => Some(*f),
            Attr::Int(i) => Some(*i as f64),
            Attr::Floats(xs) => {
                let first = *xs.first()?;
                xs.iter()
                    .all(|x| x.to_bits() == first.to_bits())
                    .then_some(first)
            }
            Attr::Ints(xs) => {
                let first = *xs.first()?;
                xs.iter().all(|&x| x == first).then_some(first as f64)
            }
            _ => None,
        }
    }

    /// The boolean, if this is [`Attr::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Attr::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The string, if this is [`Attr::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attr::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The list, if this is [`Attr::Ints`].
    pub fn as_ints(&self) -> Option<&[i64]> {
        match self {
            Attr::Ints(v) => Some(v),
            _ => None,
        }
    }

    /// The list, if this is [`Attr::Floats`].
    pub fn as_floats(&self) -> Option<&[f64]> {
        match self {
            Attr::Floats(v) => Some(v),
            _ => None,
        }
    }
}

/// The attributes of one op, in canonical order (the op table's order for
/// schema ops, sorted by name for ops with an open schema).
///
/// Construct through [`crate::OpKind::normalize_attrs`] so that defaults are
/// filled in and the order is canonical. Equality takes the order into account.
#[derive(Clone, Debug, Default)]
pub struct Attrs(IndexMap<Cow<'static, str>, Attr>);

impl PartialEq for Attrs {
    fn eq(&self, other: &Attrs) -> bool {
        self.0.iter().eq(other.0.iter())
    }
}

impl Attrs {
    /// No attributes.
    pub fn new() -> Attrs {
        Attrs::default()
    }

    /// Adds or replaces one attribute (order: insertion; normalize afterwards).
    pub fn set(&mut self, name: impl Into<Cow<'static, str>>, value: Attr) {
        self.0.insert(name.into(), value);
    }

    /// Builder form of [`Attrs::set`].
    pub fn with(mut self, name: impl Into<Cow<'static, str>>, value: Attr) -> Attrs {
        self.set(name, value);
        self
    }

    /// Looks an attribute up.
    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0.get(name)
    }

    /// Removes an attribute, keeping the order of the others.
    pub fn remove(&mut self, name: &str) -> Option<Attr> {
        self.0.shift_remove(name)
    }

    /// The attributes in canonical order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Attr)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v))
    }

    /// Number of attributes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The integer attribute `name`, if present and an integer.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.get(name)?.as_int()
    }

    /// The float attribute `name`, if present and a float.
    pub fn float(&self, name: &str) -> Option<f64> {
        self.get(name)?.as_float()
    }

    /// The boolean attribute `name`, if present and a boolean.
    pub fn bool(&self, name: &str) -> Option<bool> {
        self.get(name)?.as_bool()
    }

    /// The string attribute `name`, if present and a string.
    pub fn str(&self, name: &str) -> Option<&str> {
        self.get(name)?.as_str()
    }

    /// The integer-list attribute `name`, if present and such a list.
    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        self.get(name)?.as_ints()
    }

    /// The float-list attribute `name`, if present and such a list.
    pub fn floats(&self, name: &str) -> Option<&[f64]> {
        self.get(name)?.as_floats()
    }
}

impl<N: Into<Cow<'static, str>>> FromIterator<(N, Attr)> for Attrs {
    fn from_iter<I: IntoIterator<Item = (N, Attr)>>(iter: I) -> Attrs {
        Attrs(iter.into_iter().map(|(n, v)| (n.into(), v)).collect())
    }
}

impl IntoIterator for Attrs {
    type Item = (Cow<'static, str>, Attr);
    type IntoIter = indexmap::map::IntoIter<Cow<'static, str>, Attr>;

    /// The attributes, moved out, in canonical order.
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl Attr {
    /// The canonical form of a `constant`'s `value` for `dtype`: integer
    /// literals become floats for float dtypes, so `1` and `1.0` agree.
    pub fn literal_for(self, dtype: crate::DType) -> Attr {
        match self {
            Attr::Int(i) if dtype.is_float() => Attr::Float(i as f64),
            Attr::Ints(v) if dtype.is_float() => {
                Attr::Floats(v.into_iter().map(|i| i as f64).collect())
            }
            other => other,
        }
    }
}
