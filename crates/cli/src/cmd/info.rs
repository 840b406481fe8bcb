//! `anelm info`: what this machine offers the ANE path — the libraries found, the Objective-C
//! classes resolved, the chip — and, in one line, whether the ANE can be used and why not.
//! Always exits 0: the absence of an ANE is an answer, not an error.

use anyhow::Result;
use anelm_macos::info::{system_report, SystemReport};

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn text(r: &SystemReport) -> String {
    let mut out = format!("anelm {} on {}\n", env!("CARGO_PKG_VERSION"), r.platform);
    match &r.machine {
        Ok(m) => {
            let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
            out += &format!("chip: {} ({}), macOS {} ({})\n", or(&m.chip), or(&m.model), or(&m.os_version), or(&m.os_build));
        }
        Err(e) => out += &format!("chip: none known (no sysctl: {e})\n"),
    }
    out += "libraries:\n";
    for l in &r.libraries {
        let status = l.error.as_deref().map_or("loaded".to_string(), |e| format!("not loaded: {e}"));
        out += &format!("  {:<18} {status}\n", l.spec.name);
    }
    if r.classes.is_empty() {
        out += "classes: none resolved (no Objective-C runtime)\n";
    } else {
        let (found, missing): (Vec<_>, Vec<_>) = r.classes.iter().partition(|c| c.resolved);
        let names = |v: &[&anelm_macos::info::ClassStatus]| v.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
        out += &format!("classes resolved: {}\n", if found.is_empty() { "none".into() } else { names(&found) });
        if !missing.is_empty() {
            out += &format!("classes missing: {}\n", names(&missing));
        }
    }
    out += &r.verdict();
    out
}

fn json(r: &SystemReport) -> serde_json::Value {
    let result = |x: &Result<(), String>| match x {
        Ok(()) => serde_json::json!({"available": true}),
        Err(e) => serde_json::json!({"available": false, "reason": e}),
    };
    serde_json::json!({
        "platform": r.platform,
        "machine": r.machine.as_ref().ok().map(|m| serde_json::json!({"chip": m.chip, "model": m.model, "os_version": m.os_version, "os_build": m.os_build})),
        "libraries": r.libraries.iter().map(|l| serde_json::json!({"name": l.spec.name, "path": l.spec.path, "error": l.error})).collect::<Vec<_>>(),
        "classes": r.classes.iter().map(|c| serde_json::json!({"name": c.name, "resolved": c.resolved})).collect::<Vec<_>>(),
        "private_driver": result(&r.private_driver),
        "coreml_driver": result(&r.coreml_driver),
        "verdict": r.verdict(),
    })
}

pub fn run(args: Args) -> Result<()> {
    let r = system_report();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&r))?);
    } else {
        println!("{}", text(&r));
    }
    Ok(())
}
