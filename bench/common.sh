# shellcheck shell=bash
# Shared set-up for the bench/ scripts; source it after defining `log` and `die`.

# The llama-cpp-python release every head-to-head runs against.
LLAMA_CPP_PYTHON_VERSION="0.3.16"

# ensure_tokenmill BINARY ROOT: builds the release binary if BINARY is missing.
ensure_tokenmill() {
    local binary="$1" root="$2"
    if [[ ! -x "$binary" ]]; then
        log "building tokenmill (release)"
        (cd "$root" && cargo build --release -p tokenmill)
    fi
    [[ -x "$binary" ]] || die "no tokenmill binary at $binary"
}

# ensure_llamacpp_venv VENV CACHE_DIR: makes VENV hold llama-cpp-python[server] at the pinned
# version plus numpy (what both the server comparison and llamacpp_speed.py import), installing
# into it if needed; pip's cache (holding the compiled llama.cpp wheel) lives in CACHE_DIR/pip.
ensure_llamacpp_venv() {
    local venv="$1" cache_dir="$2"
    local spec="llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
    if ! llamacpp_venv_ready "$venv"; then
        if [[ ! -x "$venv/bin/python" ]]; then
            log "creating venv $venv"
            python3 -m venv "$venv"
        fi
        log "installing $spec and numpy (compiles llama.cpp on first install; the wheel is cached in $cache_dir/pip)"
        PIP_CACHE_DIR="$cache_dir/pip" "$venv/bin/pip" install --quiet "$spec" numpy
        llamacpp_venv_ready "$venv" || die "$spec and numpy are not importable from $venv"
    fi
}

llamacpp_venv_ready() {
    "$1/bin/python" - "$LLAMA_CPP_PYTHON_VERSION" <<'PY' 2>/dev/null
import sys
import importlib.metadata as md
import llama_cpp.server.app, numpy  # noqa: F401  (the first fails without the [server] extras)
sys.exit(0 if md.version("llama-cpp-python") == sys.argv[1] else 1)
PY
}
