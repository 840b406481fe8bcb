//! Replays every committed corpus file through its fuzz target (as CI does on every run): each
//! must return within a second, and every target must have a corpus.

use std::time::{Duration, Instant};

use anelm_fuzz::{corpus_dir, TARGETS};

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
        for f in files {
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
