//! A tiny JSON writer that encodes strings the way Go's encoding/json does (go1.21):
//! `<`, `>`, `&`, U+2028 and U+2029 are escaped, control characters other than `\n`,
//! `\r` and `\t` are written as `\u00XX`. Objects are written in the caller's key order,
//! so callers pass struct fields in declaration order and map keys sorted, as Go does.

/// Appends `s` as a JSON string literal.
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `["a","b"]` (Go marshals an empty non-nil slice as `[]`).
pub fn push_str_array(out: &mut String, items: &[String]) {
    out.push('[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_str(out, s);
    }
    out.push(']');
}

/// Appends `[true,false]`.
pub fn push_bool_array(out: &mut String, items: &[bool]) {
    out.push('[');
    for (i, b) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(if *b { "true" } else { "false" });
    }
    out.push(']');
}

/// Appends `"key":` (the key is escaped like any string).
pub fn push_key(out: &mut String, key: &str) {
    push_str(out, key);
    out.push(':');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_escapes() {
        let mut s = String::new();
        push_str(&mut s, "a<b>&\"\\\n\u{8}\u{2028}é");
        assert_eq!(s, r#""a\u003cb\u003e\u0026\"\\\n\u0008\u2028é""#);
    }
}

/// serde_json's compact output with Go's string escapes (encoding/json's HTML-safe
/// defaults): `<`, `>`, `&`, U+2028 and U+2029 as `\u003c` ..., backspace and form feed
/// as `\u0008`, `\u000c`.
struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') {
                writer.write_all(&fragment.as_bytes()[start..i])?;
                write!(writer, "\\u{:04x}", c as u32)?;
                start = i + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        use serde_json::ser::CharEscape::*;
        let s: &[u8] = match escape {
            Quote => b"\\\"",
            ReverseSolidus => b"\\\\",
            Solidus => b"\\/",
            LineFeed => b"\\n",
            CarriageReturn => b"\\r",
            Tab => b"\\t",
            Backspace => b"\\u0008",
            FormFeed => b"\\u000c",
            AsciiControl(c) => return write!(writer, "\\u{:04x}", c),
        };
        writer.write_all(s)
    }
}

/// `value` as compact JSON with Go's string escapes (what nsqd's and nsqlookupd's
/// encoding/json writes); empty if it cannot be serialized (a map with non-string keys).
pub fn to_vec_go<T: serde::Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    match value.serialize(&mut ser) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod go_formatter_tests {
    #[test]
    fn escapes_as_go() {
        let v = serde_json::json!({"a": "x<y>&z\u{2028}\u{8}\u{c}\u{1}\"\\\n/"});
        assert_eq!(
            String::from_utf8(super::to_vec_go(&v)).unwrap(),
            r#"{"a":"x\u003cy\u003e\u0026z\u2028\u0008\u000c\u0001\"\\\n/"}"#
        );
    }
}
