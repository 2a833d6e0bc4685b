//! Every target over its seed corpus (fuzz/corpus/<target>/), every saved crash
//! (fuzz/regressions/<target>/: inputs that once failed, kept as regression tests) and a
//! few thousand mutated inputs from a fixed seed, under plain `cargo test`.
use nsq_fuzz::mutate::{mutate, Rng};
use nsq_fuzz::TARGETS;
use std::path::Path;

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    Some((
                        e.path().display().to_string(),
                        std::fs::read(e.path()).ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn corpus_and_regressions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for t in TARGETS {
        let corpus = files(&root.join("corpus").join(t.name));
        assert!(!corpus.is_empty(), "no seed corpus for {}", t.name);
        for (path, data) in corpus
            .iter()
            .chain(files(&root.join("regressions").join(t.name)).iter())
        {
            println!("{}: {path}", t.name);
            (t.run)(data);
        }
    }
}

#[test]
fn mutated_inputs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for t in TARGETS {
        let pool: Vec<Vec<u8>> = files(&root.join("corpus").join(t.name))
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        // The socket and file targets are slow; the rest run thousands.
        let n = match t.name {
            "lookupd_v1" | "import_diskqueue" | "deflate" => 300,
            _ => 3000,
        };
        let mut rng = Rng::new(0x5eed ^ t.name.len() as u64);
        for _ in 0..n {
            let mut v = pool[rng.below(pool.len())].clone();
            let other = &pool[rng.below(pool.len())];
            mutate(&mut v, other, &mut rng, 4096);
            let r = std::panic::catch_unwind(|| (t.run)(&v));
            assert!(r.is_ok(), "{} failed on input {:?}", t.name, v);
        }
    }
}
