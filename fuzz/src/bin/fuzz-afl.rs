//! The AFL++ persistent-mode binary of every target; FUZZ_TARGET names the target.
//! Built by `cargo afl build --features afl -p nsq-fuzz` (scripts/fuzz.sh does it).
fn main() {
    let name = std::env::var("FUZZ_TARGET").unwrap_or_default();
    let Some(t) = nsq_fuzz::target(&name) else {
        eprintln!("FUZZ_TARGET must name one of the targets in fuzz/src/lib.rs");
        std::process::exit(2);
    };
    let run = t.run;
    afl::fuzz!(|data: &[u8]| {
        run(data);
    });
}
