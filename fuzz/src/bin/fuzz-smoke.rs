//! In-process smoke fuzzer (no AFL needed): for each target, runs its corpus
//! (`fuzz/corpus/<target>/`) and then mutated inputs for a time, and fails on a panic
//! (an invariant or a crash; the input is saved under `fuzz/artifacts/<target>/`) or on
//! one input that runs for over a second (a hang).
//!
//! ```text
//! fuzz-smoke [SECONDS_PER_TARGET] [TARGET...]     (default 10 s, every target)
//! ```

#![forbid(unsafe_code)]
use nsq_fuzz::mutate::{mutate, Rng};
use nsq_fuzz::{target, TARGETS};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(10.0);
    let names: Vec<&str> = if args.len() > 1 {
        args[1..].iter().map(String::as_str).collect()
    } else {
        TARGETS.iter().map(|t| t.name).collect()
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    std::panic::set_hook(Box::new(|_| {}));
    let mut failed = false;
    println!("fuzz-smoke: {secs} s per target, seed {seed}");
    for name in names {
        let Some(t) = target(name) else {
            eprintln!("unknown target {name}");
            std::process::exit(2);
        };
        let mut pool = corpus(&root.join("corpus").join(name));
        if pool.is_empty() {
            pool.push(Vec::new());
        }
        let mut rng = Rng::new(seed ^ name.len() as u64);
        let start = Instant::now();
        let mut execs = 0u64;
        let mut slowest = Duration::ZERO;
        let mut fail: Option<(Vec<u8>, String)> = None;
        let mut i = 0usize;
        while fail.is_none() {
            let input = if i < pool.len() {
                pool[i].clone()
            } else {
                if start.elapsed().as_secs_f64() >= secs {
                    break;
                }
                let mut v = pool[rng.below(pool.len())].clone();
                let other = pool[rng.below(pool.len())].clone();
                mutate(&mut v, &other, &mut rng, 4096);
                v
            };
            i += 1;
            let t0 = Instant::now();
            let r = catch_unwind(AssertUnwindSafe(|| (t.run)(&input)));
            let took = t0.elapsed();
            slowest = slowest.max(took);
            execs += 1;
            match r {
                Err(e) => {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    fail = Some((input, format!("crash: {msg}")));
                }
                Ok(()) if took > Duration::from_secs(1) => {
                    fail = Some((input, format!("hang: {took:?}")));
                }
                Ok(()) => {
                    // Keep some mutants to go deeper (a poor man's corpus growth).
                    if i > pool.len() && pool.len() < 4096 && rng.below(64) == 0 {
                        pool.push(input);
                    }
                }
            }
        }
        let el = start.elapsed().as_secs_f64();
        match fail {
            None => println!(
                "{name:18} ok: {execs} execs in {el:.1} s ({:.0}/s), slowest {slowest:?}",
                execs as f64 / el
            ),
            Some((input, why)) => {
                failed = true;
                let dir = root.join("artifacts").join(name);
                let _ = std::fs::create_dir_all(&dir);
                let h = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                });
                let path = dir.join(format!("crash-{h:016x}"));
                let _ = std::fs::write(&path, &input);
                println!(
                    "{name:18} FAILED after {execs} execs: {why}; input saved to {}",
                    path.display()
                );
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
