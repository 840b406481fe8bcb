//! Shared by the quant_* integration tests: the Python checker and the model files (both found as
//! TEAM.md says, failing with a clear message when missing), a stream reader for the results of
//! tests/gguf_py_quant.py, and deterministic random data. Each test binary uses a part of it.

#![allow(dead_code, unused_imports)]

use std::ffi::OsStr;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;

use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

pub use anelm_testkit::{model, python, workspace_root};

/// A generator with a fixed seed: every run sees the same data.
pub fn rng() -> TestRng {
    TestRng::deterministic_rng(RngAlgorithm::ChaCha)
}

/// `n` values in (-1, 1) times 2^e, e uniform in -20..20: many magnitudes, both signs.
pub fn spread_values(rng: &mut TestRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let unit = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            unit * 2f32.powi((rng.next_u64() % 40) as i32 - 20)
        })
        .collect()
}

/// Where ours and gguf-py's values first differ, and how many differ.
pub struct Mismatch {
    pub index: usize,
    pub count: usize,
    pub message: String,
}

/// A running tests/gguf_py_quant.py, read result by result.
pub struct GgufPy {
    child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: Option<JoinHandle<String>>,
}

impl GgufPy {
    pub fn spawn<S: AsRef<OsStr>>(args: &[S]) -> GgufPy {
        // From the workspace root: the ANE lowering's tests include this module too.
        let script = workspace_root().join("crates/formats/tests/gguf_py_quant.py");
        let mut child = Command::new(python())
            .arg(script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the Python checker");
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().expect("piped stdout"));
        let mut err = child.stderr.take().expect("piped stderr");
        // Drained on its own thread so that a chatty stderr cannot block the pipe we read.
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        GgufPy {
            child,
            stdout,
            stderr: Some(stderr),
        }
    }

    /// Stops the checker and fails the test with `msg` and whatever the checker said.
    fn fail(&mut self, msg: &str) -> ! {
        let _ = self.child.kill();
        let status = self.child.wait();
        let stderr = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        panic!("{msg}\ngguf_py_quant.py ({status:?}) said:\n{stderr}");
    }

    fn read_exact(&mut self, buf: &mut [u8], what: &str) {
        if let Err(e) = self.stdout.read_exact(buf) {
            self.fail(&format!("reading {what} from the checker: {e}"));
        }
    }

    /// Reads the whole raw output (for `quantize`) and checks the checker succeeded.
    pub fn read_all(mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Err(e) = self.stdout.read_to_end(&mut out) {
            self.fail(&format!("reading the checker's output: {e}"));
        }
        self.finish();
        out
    }

    /// Reads the next dequantised result and compares it bit for bit with `ours`, after checking
    /// its ggml type id and length. `None` when every bit agrees.
    pub fn compare_next(&mut self, what: &str, type_id: u32, ours: &[f32]) -> Option<Mismatch> {
        let mut header = [0u8; 12];
        self.read_exact(&mut header, &format!("the header of {what}"));
        let (t, n) = header.split_at(4);
        let their_type = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        let n = u64::from_le_bytes([n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]]) as usize;
        if (their_type, n) != (type_id, ours.len()) {
            self.fail(&format!(
                "{what}: gguf-py has type id {their_type} with {n} values, ours {type_id} with {}",
                ours.len()
            ));
        }
        let mut mismatch: Option<Mismatch> = None;
        const CHUNK: usize = 1 << 20;
        let mut buf = vec![0u8; 4 * CHUNK];
        for (chunk_index, ours) in ours.chunks(CHUNK).enumerate() {
            let bytes = &mut buf[..4 * ours.len()];
            if let Err(e) = self.stdout.read_exact(bytes) {
                self.fail(&format!("reading the values of {what}: {e}"));
            }
            for (i, (theirs, mine)) in bytes.chunks_exact(4).zip(ours).enumerate() {
                let theirs = u32::from_le_bytes([theirs[0], theirs[1], theirs[2], theirs[3]]);
                if theirs != mine.to_bits() {
                    let m = mismatch.get_or_insert_with(|| Mismatch {
                        index: chunk_index * CHUNK + i,
                        count: 0,
                        message: format!(
                            "ours {mine:e} ({:#010x}), gguf-py {:e} ({theirs:#010x})",
                            mine.to_bits(),
                            f32::from_bits(theirs)
                        ),
                    });
                    m.count += 1;
                }
            }
        }
        if let Some(m) = &mut mismatch {
            m.message = format!(
                "{what}: {} of {n} values differ; first at {}: {}",
                m.count, m.index, m.message
            );
        }
        mismatch
    }

    /// Checks the checker wrote nothing more and exited successfully.
    pub fn finish(mut self) {
        let mut rest = [0u8; 1];
        match self.stdout.read(&mut rest) {
            Ok(0) => {}
            Ok(_) => self.fail("the checker wrote more results than expected"),
            Err(e) => self.fail(&format!("reading the checker's output: {e}")),
        }
        match self.child.wait() {
            Ok(s) if s.success() => {}
            other => self.fail(&format!("the checker failed: {other:?}")),
        }
    }
}
