//! Names this build: `NSQD_RS_COMMIT` is the short git hash of the checkout
//! (`git rev-parse --short HEAD`), or `unknown` when git or the repository is absent
//! (a source tarball, a crate package). It never fails the build.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NSQD_RS_COMMIT={commit}");
    // Run again when HEAD moves: the HEAD file (a branch switch) and the branch's ref
    // (a commit), or packed-refs where the ref is packed. Only paths that exist are
    // named: a missing one would make cargo rerun this script on every build.
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watch.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watch.into_iter().flatten() {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
