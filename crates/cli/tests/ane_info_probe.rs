//! `anelm info`, `anelm probe` and `--device ane` off a Mac: info exits 0 and explains the
//! absence of an ANE in one line; probe and model commands on the ANE fail cleanly (one error
//! line, non-zero exit, no panic) with either driver.

use std::process::Command;

fn anelm(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn on_mac() -> bool {
    std::env::consts::OS == "macos"
}

#[test]
fn info_explains_in_one_line() {
    let (code, stdout, stderr) = anelm(&["info"]);
    assert_eq!(code, 0, "{stderr}");
    let verdicts: Vec<&str> = stdout.lines().filter(|l| l.starts_with("ANE: ")).collect();
    assert_eq!(verdicts.len(), 1, "{stdout}");
    assert!(
        stdout.contains("AppleNeuralEngine") && stdout.contains("CoreML"),
        "every library is listed: {stdout}"
    );
    if !on_mac() {
        let want = format!(
            "ANE: none — this is {}/{};",
            std::env::consts::OS,
            std::env::consts::ARCH
        );
        assert!(
            verdicts[0].starts_with(&want) && verdicts[0].contains("libobjc"),
            "{}",
            verdicts[0]
        );
        assert!(stdout.contains("chip: none known"), "{stdout}");
    }
}

#[test]
fn info_json() {
    let (code, stdout, stderr) = anelm(&["info", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["libraries"].as_array().unwrap().len(), 7);
    assert!(v["verdict"].as_str().unwrap().starts_with("ANE: "));
    if !on_mac() {
        assert_eq!(v["private_driver"]["available"], false);
        assert_eq!(v["coreml_driver"]["available"], false);
        assert!(v["private_driver"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("no ANE here: "));
        assert!(v["machine"].is_null());
    }
}

#[test]
fn probe_fails_cleanly_without_an_ane() {
    if on_mac() {
        // On a Mac, probe is a hardware test: scripts/mac-hardware-check.sh runs it.
        let (code, stdout, stderr) = anelm(&["probe", "--runs", "1"]);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            code == 0 || stderr.starts_with("error: "),
            "{stdout}{stderr}"
        );
        return;
    }
    for driver in ["private", "coreml"] {
        let (code, stdout, stderr) = anelm(&["probe", "--driver", driver]);
        assert_eq!(code, 1, "{driver}: {stdout}{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line expected: {stderr}");
        assert!(
            lines[0].starts_with(&format!(
                "error: anelm probe --driver {driver}: no ANE here: "
            )),
            "{stderr}"
        );
    }
}

#[test]
fn probe_rejects_bad_sizes_before_looking_for_an_ane() {
    let (code, _, stderr) = anelm(&["probe", "--channels", "0"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("--channels and --width must be between 1 and 4096"),
        "{stderr}"
    );
}

#[test]
fn model_commands_on_the_ane_fail_cleanly_without_one() {
    let model = anelm_testkit::tiny("llama");
    for (command, driver) in [
        ("eval", "private"),
        ("eval", "coreml"),
        ("verify", "private"),
        ("verify", "coreml"),
    ] {
        let args = [
            command,
            "--model",
            model.to_str().unwrap(),
            "--ids",
            "1,2",
            "--device",
            "ane",
            "--driver",
            driver,
        ];
        let (code, stdout, stderr) = anelm(&args);
        assert!(!stderr.contains("panicked"), "{stderr}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.contains("loading"))
            .collect();
        if on_mac() {
            // A hardware run: it works, or says in one line why not.
            assert!(
                code == 0 || (lines.len() == 1 && lines[0].starts_with("error: ")),
                "{command} {driver}: {stdout}{stderr}"
            );
        } else {
            assert_eq!(code, 1, "{command} {driver}: {stdout}{stderr}");
            assert_eq!(lines.len(), 1, "{stderr}");
            assert!(
                lines[0].starts_with("error: no ANE here: libobjc is not available"),
                "{stderr}"
            );
        }
    }
}
