//! Decoding a JSON object into a flat struct as Go's encoding/json does (`json.Unmarshal`
//! into nsqd's `identifyDataV2` and nsqlookupd's `PeerInfo`), where it differs from a
//! strict decoder:
//! * the whole input is checked first with Go's scanner grammar (nesting up to 10,000
//!   levels; any number literal, however large, is fine where no field takes it);
//! * `null` at the top leaves every field as it is; another non-object is a type error;
//! * members are applied in document order, so a repeated key's last value wins, and a
//!   `null` value leaves the field as it was;
//! * a key names a field exactly, else case-insensitively with Unicode simple folding
//!   (so `TCP_PORT`, and `ſ` for `s`, `K` (Kelvin sign) for `k`);
//! * strings: bytes that are not UTF-8 and unpaired surrogate escapes become U+FFFD;
//! * an integer field takes only an integer literal (`strconv.ParseInt`: `-0` is 0,
//!   `1.0` and `1e2` are type errors) within the field's size;
//! * a type error does not stop the decode, but the decode fails at the end.

/// Go's scanner limit on nesting (encoding/json maxNestingDepth).
const MAX_DEPTH: usize = 10_000;

/// A member's value, as far as a flat struct needs it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as its literal.
    Number(String),
    /// A string, unquoted.
    String(String),
    /// An array (its content checked and skipped).
    Array,
    /// An object (its content checked and skipped).
    Object,
}

impl Value {
    /// Go's name for the JSON type in an UnmarshalTypeError.
    pub fn kind(&self) -> String {
        match self {
            Value::Null => "null".into(),
            Value::Bool(_) => "bool".into(),
            Value::Number(n) => format!("number {n}"),
            Value::String(_) => "string".into(),
            Value::Array => "array".into(),
            Value::Object => "object".into(),
        }
    }
}

/// Why a body could not be decoded at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not JSON by Go's scanner (its message, for logs).
    Syntax(String),
    /// Valid JSON, but not an object or `null` (Go's JSON type name).
    NotObject(&'static str),
    /// [`DecodeError::NotObject`] where the Go type decoded into is named (`json: cannot
    /// unmarshal array into Go value of type nsqlookupd.PeerInfo`).
    NotObjectOf {
        /// Go's JSON type name of the value (`array`, `string`).
        kind: &'static str,
        /// The Go type decoded into.
        go_type: &'static str,
    },
    /// A member of the wrong JSON type for its field, or an integer out of its range
    /// (`json: cannot unmarshal string into Go struct field .tcp_port of type int`).
    FieldType {
        /// The field's JSON name.
        field: String,
        /// Go's description of the value (`string`, `number 1.5`).
        found: String,
        /// The field's Go type (`int`, `int32`, `string`, `bool`).
        go_type: &'static str,
    },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Syntax(m) => f.write_str(m),
            DecodeError::NotObject(k) => write!(f, "json: cannot unmarshal {k} into Go value"),
            DecodeError::NotObjectOf { kind, go_type } => {
                write!(
                    f,
                    "json: cannot unmarshal {kind} into Go value of type {go_type}"
                )
            }
            DecodeError::FieldType {
                field,
                found,
                go_type,
            } => write!(
                f,
                "json: cannot unmarshal {found} into Go struct field .{field} of type {go_type}"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The top-level object's members in document order (repeats kept); `None` for `null`.
pub fn object_members(body: &[u8]) -> Result<Option<Vec<(String, Value)>>, DecodeError> {
    let mut p = Parser { b: body, i: 0 };
    p.ws();
    let members = match p.peek() {
        Some(b'{') => Some(p.members()?),
        Some(b'n') => {
            p.literal(b"null")?;
            None
        }
        _ => {
            let v = p.value(0)?;
            p.end()?;
            let kind = match v {
                Value::Bool(_) => "bool",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                _ => "array",
            };
            return Err(DecodeError::NotObject(kind));
        }
    };
    p.end()?;
    Ok(members)
}

/// Whether the JSON key `key` names the struct field `name` (its JSON name: ASCII) when
/// no field has `key` exactly: Go's case folding (bytes.EqualFold's simple folding; for
/// ASCII names that is ASCII case, plus `ſ` U+017F for `s` and `K` U+212A for `k`).
pub fn folds_to(name: &str, key: &str) -> bool {
    let mut k = key.chars();
    for n in name.chars() {
        let Some(c) = k.next() else {
            return false;
        };
        let same = c.eq_ignore_ascii_case(&n)
            || (n.eq_ignore_ascii_case(&'s') && c == '\u{17f}')
            || (n.eq_ignore_ascii_case(&'k') && c == '\u{212a}');
        if !same {
            return false;
        }
    }
    k.next().is_none()
}

/// The field of `names` that `key` sets: an exact match first, else a folded one.
pub fn field_for<'n>(names: &[&'n str], key: &str) -> Option<&'n str> {
    names
        .iter()
        .find(|n| **n == key)
        .or_else(|| names.iter().find(|n| folds_to(n, key)))
        .copied()
}

/// A string field: `Ok(None)` for `null` (the field stays as it was).
pub fn string_field(field: &str, v: &Value) -> Result<Option<String>, DecodeError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(type_error(field, other, "string")),
    }
}

/// A bool field: `Ok(None)` for `null`.
pub fn bool_field(field: &str, v: &Value) -> Result<Option<bool>, DecodeError> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        other => Err(type_error(field, other, "bool")),
    }
}

/// An integer field of `bits` bits (32 or 64): `Ok(None)` for `null`.
pub fn int_field(field: &str, v: &Value, bits: u32) -> Result<Option<i64>, DecodeError> {
    let go_type = if bits == 32 { "int32" } else { "int" };
    match v {
        Value::Null => Ok(None),
        Value::Number(lit) => {
            let n: i64 = lit.parse().map_err(|_| type_error(field, v, go_type))?;
            let fits = bits >= 64 || (n >= -(1i64 << (bits - 1)) && n < 1i64 << (bits - 1));
            if fits {
                Ok(Some(n))
            } else {
                Err(type_error(field, v, go_type))
            }
        }
        other => Err(type_error(field, other, go_type)),
    }
}

fn type_error(field: &str, v: &Value, go_type: &'static str) -> DecodeError {
    DecodeError::FieldType {
        field: field.to_string(),
        found: v.kind(),
        go_type,
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

fn syntax(msg: &str) -> DecodeError {
    DecodeError::Syntax(msg.to_string())
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn end(&mut self) -> Result<(), DecodeError> {
        self.ws();
        if self.i == self.b.len() {
            Ok(())
        } else {
            Err(syntax("invalid character after top-level value"))
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), DecodeError> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else if self.peek().is_none() {
            Err(syntax("unexpected end of JSON input"))
        } else {
            Err(syntax("invalid character"))
        }
    }

    fn literal(&mut self, lit: &[u8]) -> Result<(), DecodeError> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(syntax("invalid literal"))
        }
    }

    /// `{` members `}` of the top-level object.
    fn members(&mut self) -> Result<Vec<(String, Value)>, DecodeError> {
        self.expect(b'{')?;
        let mut out = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(out);
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(syntax(
                    "invalid character looking for beginning of object key",
                ));
            }
            let key = self.string()?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            let v = self.value(1)?;
            out.push((key, v));
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(out);
                }
                None => return Err(syntax("unexpected end of JSON input")),
                _ => return Err(syntax("invalid character after object key:value pair")),
            }
        }
    }

    /// A value at nesting `depth` (containers around it): scalars decoded, arrays and
    /// objects checked and skipped.
    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        match self.peek() {
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.literal(b"true").map(|_| Value::Bool(true)),
            Some(b'f') => self.literal(b"false").map(|_| Value::Bool(false)),
            Some(b'n') => self.literal(b"null").map(|_| Value::Null),
            Some(b'-' | b'0'..=b'9') => Ok(Value::Number(self.number()?.to_string())),
            Some(c @ (b'[' | b'{')) => {
                self.skip_container(depth)?;
                Ok(if c == b'[' {
                    Value::Array
                } else {
                    Value::Object
                })
            }
            None => Err(syntax("unexpected end of JSON input")),
            _ => Err(syntax("invalid character looking for beginning of value")),
        }
    }

    /// Checks an array or object without recursion (Go allows 10,000 levels).
    fn skip_container(&mut self, depth: usize) -> Result<(), DecodeError> {
        // The open containers: true for an object.
        let mut stack: Vec<bool> = Vec::new();
        loop {
            // At the start of a value.
            self.ws();
            match self.peek() {
                Some(c @ (b'[' | b'{')) => {
                    if depth + stack.len() + 1 > MAX_DEPTH {
                        return Err(syntax("exceeded max depth"));
                    }
                    self.i += 1;
                    stack.push(c == b'{');
                    self.ws();
                    let close = if c == b'{' { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.i += 1;
                        stack.pop();
                    } else {
                        if c == b'{' {
                            self.key()?;
                        }
                        continue;
                    }
                }
                _ => {
                    self.value(depth + stack.len())?;
                }
            }
            // After a value: a comma, or the close of its container(s).
            loop {
                let Some(&object) = stack.last() else {
                    return Ok(());
                };
                self.ws();
                match (self.peek(), object) {
                    (Some(b','), _) => {
                        self.i += 1;
                        if object {
                            self.ws();
                            self.key()?;
                        }
                        break;
                    }
                    (Some(b'}'), true) | (Some(b']'), false) => {
                        self.i += 1;
                        stack.pop();
                    }
                    (None, _) => return Err(syntax("unexpected end of JSON input")),
                    _ => return Err(syntax("invalid character after value")),
                }
            }
        }
    }

    /// An object key and its colon.
    fn key(&mut self) -> Result<(), DecodeError> {
        if self.peek() != Some(b'"') {
            return Err(syntax(
                "invalid character looking for beginning of object key",
            ));
        }
        self.string()?;
        self.ws();
        self.expect(b':')
    }

    /// A number literal by JSON's grammar.
    fn number(&mut self) -> Result<&str, DecodeError> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let s = p.i;
            while matches!(p.peek(), Some(b'0'..=b'9')) {
                p.i += 1;
            }
            p.i > s
        };
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(syntax("invalid character in numeric literal")),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !digits(self) {
                return Err(syntax(
                    "invalid character after decimal point in numeric literal",
                ));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !digits(self) {
                return Err(syntax("invalid character in exponent of numeric literal"));
            }
        }
        // ASCII only.
        Ok(std::str::from_utf8(&self.b[start..self.i]).unwrap_or_default())
    }

    /// A string literal, unquoted as Go's unquote does.
    fn string(&mut self) -> Result<String, DecodeError> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(syntax("unexpected end of JSON input"));
            };
            match c {
                b'"' => {
                    self.i += 1;
                    break;
                }
                b'\\' => {
                    self.i += 1;
                    let Some(e) = self.peek() else {
                        return Err(syntax("unexpected end of JSON input"));
                    };
                    self.i += 1;
                    let simple = match e {
                        b'"' => Some(b'"'),
                        b'\\' => Some(b'\\'),
                        b'/' => Some(b'/'),
                        b'b' => Some(8),
                        b'f' => Some(12),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        b'u' => None,
                        _ => return Err(syntax("invalid character in string escape code")),
                    };
                    if let Some(s) = simple {
                        out.push(s);
                        continue;
                    }
                    let u = self.hex4()?;
                    let ch = if (0xd800..0xdc00).contains(&u) {
                        // A high surrogate takes the next escape only if it is a low one.
                        let low = (self.b.get(self.i) == Some(&b'\\')
                            && self.b.get(self.i + 1) == Some(&b'u'))
                        .then(|| hex4_at(self.b, self.i + 2))
                        .flatten()
                        .filter(|l| (0xdc00..0xe000).contains(l));
                        match low {
                            Some(l) => {
                                self.i += 6;
                                char::from_u32(0x10000 + ((u - 0xd800) << 10) + (l - 0xdc00))
                            }
                            None => None,
                        }
                    } else {
                        char::from_u32(u)
                    };
                    let mut tmp = [0u8; 4];
                    out.extend_from_slice(
                        ch.unwrap_or('\u{fffd}').encode_utf8(&mut tmp).as_bytes(),
                    );
                }
                0..=0x1f => return Err(syntax("invalid character in string literal")),
                _ => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn hex4(&mut self) -> Result<u32, DecodeError> {
        let v = hex4_at(self.b, self.i)
            .ok_or_else(|| syntax("invalid character in \\u hexadecimal character escape"))?;
        self.i += 4;
        Ok(v)
    }
}

fn hex4_at(b: &[u8], at: usize) -> Option<u32> {
    let h = b.get(at..at + 4)?;
    h.iter()
        .try_fold(0u32, |n, &c| Some(n << 4 | (c as char).to_digit(16)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(s: &[u8]) -> Vec<(String, Value)> {
        object_members(s).unwrap().unwrap()
    }

    #[test]
    fn objects_in_document_order_with_repeats() {
        let m = members(br#"{"a":1,"A":"x","a":null,"n":[1,{"b":[]}],"o":{},"t":true}"#);
        assert_eq!(
            m,
            vec![
                ("a".into(), Value::Number("1".into())),
                ("A".into(), Value::String("x".into())),
                ("a".into(), Value::Null),
                ("n".into(), Value::Array),
                ("o".into(), Value::Object),
                ("t".into(), Value::Bool(true)),
            ]
        );
        assert_eq!(object_members(b" null "), Ok(None));
        assert_eq!(object_members(b"[]"), Err(DecodeError::NotObject("array")));
        assert_eq!(object_members(b"1"), Err(DecodeError::NotObject("number")));
        for bad in [
            &b""[..],
            b"{",
            b"{\"a\"}",
            b"{\"a\":1,}",
            b"{\"a\":01}",
            b"{\"a\":1.}",
            b"{\"a\":\"\x01\"}",
            b"{\"a\":\"\\x\"}",
            b"{} x",
            b"{\"a\":[1,]}",
            b"{\"a\":{\"b\"}}",
            b"{\"a\":tru}",
        ] {
            assert!(
                matches!(object_members(bad), Err(DecodeError::Syntax(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn strings_as_go_unquotes_them() {
        let s = |lit: &[u8]| match &members(&[b"{\"k\":", lit, b"}"].concat())[0].1 {
            Value::String(s) => s.clone(),
            v => panic!("{v:?}"),
        };
        assert_eq!(s(br#""\ud800""#), "\u{fffd}");
        assert_eq!(s(br#""\ud83d\ude00""#), "\u{1f600}");
        assert_eq!(s(br#""\ud800\u0041""#), "\u{fffd}A");
        assert_eq!(s(b"\"a\xffb\""), "a\u{fffd}b");
        assert_eq!(s(br#""\/\n\u00e9""#), "/\n\u{e9}");
    }

    #[test]
    fn nesting_up_to_go_s_limit_and_any_number() {
        let nest = |n: usize| {
            [
                b"{\"x\":".to_vec(),
                b"[".repeat(n),
                b"]".repeat(n),
                b"}".to_vec(),
            ]
            .concat()
        };
        assert!(object_members(&nest(9_999)).is_ok());
        assert!(object_members(&nest(10_000)).is_err());
        assert!(object_members(br#"{"x":1e999999,"y":-0}"#).is_ok());
    }

    #[test]
    fn fields_as_go_matches_and_converts_them() {
        let names = ["tcp_port", "broadcast_address", "hostname"];
        assert_eq!(field_for(&names, "tcp_port"), Some("tcp_port"));
        assert_eq!(field_for(&names, "TCP_Port"), Some("tcp_port"));
        assert_eq!(
            field_for(&names, "broadcast_addre\u{17f}s"),
            Some("broadcast_address")
        );
        assert_eq!(field_for(&names, "tcp_portx"), None);
        let n = |lit: &str| Value::Number(lit.into());
        assert_eq!(int_field("f", &n("-0"), 64), Ok(Some(0)));
        assert!(int_field("f", &n("1.0"), 64).is_err());
        assert!(int_field("f", &n("1e2"), 64).is_err());
        assert!(int_field("f", &n("2147483648"), 32).is_err());
        assert_eq!(int_field("f", &n("-2147483648"), 32), Ok(Some(-2147483648)));
        assert_eq!(int_field("f", &Value::Null, 64), Ok(None));
        assert!(string_field("f", &n("1")).is_err());
        assert_eq!(bool_field("f", &Value::Bool(false)), Ok(Some(false)));
        assert!(bool_field("f", &Value::String("true".into())).is_err());
    }
}
