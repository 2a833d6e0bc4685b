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
