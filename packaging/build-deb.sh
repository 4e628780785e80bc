#!/usr/bin/env bash
# packaging/build-deb.sh [CARGO-DEB OPTIONS...] — build agent-state_VERSION_ARCH.deb
# in target/debian/: the release binaries, the man pages and completions they
# generate (target/docs/, by agent-state-docs from the CLI definition and the
# README), then `cargo deb --no-build` with [package.metadata.deb] of
# Cargo.toml. Options go to cargo deb, e.g. --deb-version 0.1.1-1.
# Needs cargo-deb: `cargo install cargo-deb --locked`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deb --version >/dev/null 2>&1; then
    echo "build-deb.sh: cargo-deb is missing: cargo install cargo-deb --locked" >&2
    exit 69
fi
cargo build --release --locked --bins
target_dir=${CARGO_TARGET_DIR:-target}
rm -rf target/docs
"$target_dir/release/agent-state-docs" target/docs
cargo deb --no-build "$@"
