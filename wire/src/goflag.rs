//! Go's flag package command-line syntax (Go: flag), which nsqd and nsqlookupd accept:
//! a long flag may start with one dash (`-tcp-address=...`).

/// Rewrites Go-style `-long-flag` arguments into `--long-flag`.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            if i > 0 && a.starts_with('-') && !a.starts_with("--") && a.len() > 2 {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_dash_long_flags() {
        let args = ["nsqd", "-tcp-address=x", "--http-address=y", "-v", "-"];
        let got = normalize_args(args.iter().map(|s| s.to_string()));
        assert_eq!(
            got,
            ["nsqd", "--tcp-address=x", "--http-address=y", "-v", "-"]
        );
    }
}
