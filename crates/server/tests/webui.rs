//! The web chat in a real headless Chromium (Debian's /usr/bin/chromium, driven by
//! playwright-core; scripts/setup-browser.sh installs both). The screenshot after pressing
//! stop is kept in target/ci-artifacts/webui.png.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{artifacts_dir, base, client, config, health, start};

/// `$ANELM_CHROMIUM`, else Debian's.
fn chromium() -> PathBuf {
    let p = std::env::var_os("ANELM_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-browser.sh",
        p.display()
    );
    p
}

/// playwright-core: `$ANELM_BROWSER_DEPS/node_modules/playwright-core`, by default under
/// `<workspace>/target/browser-test`.
fn playwright_core() -> PathBuf {
    let dir = std::env::var_os("ANELM_BROWSER_DEPS").map_or_else(
        || anelm_testkit::workspace_root().join("target/browser-test"),
        PathBuf::from,
    );
    let p = dir.join("node_modules/playwright-core");
    assert!(
        p.join("package.json").exists(),
        "{} is missing: run scripts/setup-browser.sh",
        p.display()
    );
    p.canonicalize().expect("playwright-core's directory")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_chat_streams_stops_and_renders_in_chromium() {
    let server = start(config(2, 4));
    let base = base(&server);
    let screenshot = artifacts_dir().join("webui.png");
    let _ = std::fs::remove_file(&screenshot);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webui/webui.cjs");
    let mut node = Command::new("node");
    node.arg(&script)
        .env("BASE", &base)
        .env("CHROMIUM", chromium())
        .env("PLAYWRIGHT_CORE", playwright_core())
        .env("SCREENSHOT", &screenshot);
    let out = tokio::task::spawn_blocking(move || node.output())
        .await
        .unwrap()
        .expect("running node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("7 passed, 0 failed"), "{stdout}");

    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} is not a real screenshot",
        screenshot.display()
    );
    println!("screenshot saved: {}", screenshot.display());

    // Stop closed the connection, and the server cancelled that generation.
    let c = client();
    let t = Instant::now();
    loop {
        let h = health(&c, &base).await;
        if h["busy"] == 0 {
            assert!(
                h["cancelled"].as_u64() >= Some(1),
                "the stopped answer was not cancelled: {h}"
            );
            assert_eq!(h["failed"], 0, "{h}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "still busy: {h}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
