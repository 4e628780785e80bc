//! Build script: the commit the binary is built from, for `--version`
//! (`agent-state 0.1.0 (commit 1a2b3c4d5e6f)`), from the git checkout when
//! there is one; "unknown" in a source tree without git (a release tarball
//! may set AGENT_STATE_COMMIT itself).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=AGENT_STATE_COMMIT");
    let commit = std::env::var("AGENT_STATE_COMMIT").ok().unwrap_or_else(|| {
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "unknown".to_string())
    });
    println!("cargo:rustc-env=AGENT_STATE_COMMIT={commit}");
    // Rebuilt when HEAD moves: HEAD itself, the branch it names, packed refs.
    let git = Path::new(".git");
    // Only files that exist: a missing one would rerun this every build.
    let watch = |rel: &str| {
        if git.join(rel).is_file() {
            println!("cargo:rerun-if-changed=.git/{rel}");
        }
    };
    if git.is_dir() {
        watch("HEAD");
        watch("packed-refs");
        if let Ok(head) = std::fs::read_to_string(git.join("HEAD"))
            && let Some(r) = head.trim().strip_prefix("ref: ")
        {
            watch(r);
        }
    }
}
