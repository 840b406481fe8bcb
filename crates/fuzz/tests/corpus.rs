//! Replays every committed corpus file, and every input that once crashed a target
//! (`regressions/`), through its fuzz target (as CI does on every run): each must return within
//! a second, and every target must have a corpus.

use std::time::{Duration, Instant};

use anelm_fuzz::{corpus_dir, regressions_dir, TARGETS};

#[test]
fn every_corpus_file_replays_without_a_crash_or_hang() {
    let mut total = 0;
    for (name, run) in TARGETS {
        let dir = corpus_dir(name);
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!files.is_empty(), "{name}: empty corpus");
        let regressions: Vec<_> = std::fs::read_dir(regressions_dir(name))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        for f in files.into_iter().chain(regressions) {
            let data = std::fs::read(&f).unwrap();
            let start = Instant::now();
            run(&data);
            let took = start.elapsed();
            assert!(took < Duration::from_secs(1), "{}: {took:?}", f.display());
            total += 1;
        }
    }
    assert!(total >= TARGETS.len());
}

#[test]
fn the_crashes_found_are_kept_as_regressions() {
    for (name, n) in [("chat_template", 2), ("tokenizer_json", 1)] {
        let found = std::fs::read_dir(regressions_dir(name)).map_or(0, |d| d.count());
        assert!(found >= n, "{name}: {found} regressions");
    }
}
