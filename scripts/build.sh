# shellcheck shell=bash
# The one compilation of the tests (sourced by scripts/test and scripts/chaos, which build with
# `build_for_tests`, so that neither compiles again what the other built).
#
# use_lint_build: the workspace's crates are compiled by clippy-driver, which runs clippy's
# lints with `-D warnings` (as `cargo clippy --all-targets -- -D warnings` does) while it emits
# the real artifacts, so the lints cost no compilation of their own. Every cargo command run
# with this environment (the build, nextest, the fault harness) then finds what the others
# built; one without it recompiles the workspace's crates (not their dependencies).
use_lint_build() {
    local driver
    driver="$(command -v clippy-driver || true)"
    if [ -z "$driver" ]; then
        echo "clippy-driver is missing: rustup component add clippy" >&2
        return 1
    fi
    export RUSTC_WORKSPACE_WRAPPER="$driver"
    export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
}

# build_for_tests: everything the tests run, built once: every target of the workspace (the
# services' binaries, which the integration tests start as processes, included), with the
# reference page's renderer in place (the query service's build embeds it, so a build without
# it would differ) and the lints riding on the compilation (use_lint_build). A fresh clone in CI
# compiles everything once: incremental state would only be written, never read.
build_for_tests() {
    ensure_reference_bundle
    use_lint_build
    if [ -n "${CI:-}" ]; then
        export CARGO_INCREMENTAL=0
    fi
    cargo build --workspace --all-targets --locked --quiet
}
