# shellcheck shell=bash
# Shared set-up for the bench/ scripts; source it after defining `log` and `die`.

# The llama-cpp-python release every head-to-head runs against (0.3.36 for the families
# 0.3.16's llama.cpp lacks: Gemma 4, gpt-oss, Qwen3.5).
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.16}"

# free_port: a TCP port on 127.0.0.1 that nothing listens on now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# One tokenmill server at a time (prefix_cache_ttft.sh, spec_sitting.sh; the caller sets
# `trap stop_tokenmill EXIT INT TERM`). start_tokenmill BINARY PORT LOG SERVE_ARGS...: `BINARY serve
# --host 127.0.0.1 --port PORT SERVE_ARGS...` in a new session whose id is its pid, output to
# LOG; returns once /health answers (dies if the server exits first or after 300 s).
TOKENMILL_PID=""
start_tokenmill() {
    local binary="$1" port="$2" server_log="$3"; shift 3
    setsid "$binary" serve --host 127.0.0.1 --port "$port" "$@" >"$server_log" 2>&1 &
    TOKENMILL_PID=$!
    local waited=0
    until curl -fs -o /dev/null "http://127.0.0.1:$port/health"; do
        kill -0 "$TOKENMILL_PID" 2>/dev/null || die "server exited during start-up (see $server_log)"
        (( waited++ < 600 )) || die "server did not start (see $server_log)"
        sleep 0.5
    done
}

# stop_tokenmill: ends the server start_tokenmill started, and its session, if one is running.
stop_tokenmill() {
    [[ -n "$TOKENMILL_PID" ]] || return 0
    kill -TERM -- "-$TOKENMILL_PID" 2>/dev/null || true
    wait "$TOKENMILL_PID" 2>/dev/null || true
    TOKENMILL_PID=""
}

# ensure_tokenmill BINARY ROOT: builds the release binary if BINARY is missing.
ensure_tokenmill() {
    local binary="$1" root="$2"
    if [[ ! -x "$binary" ]]; then
        log "building tokenmill (release)"
        (cd "$root" && cargo build --release -p tokenmill)
    fi
    [[ -x "$binary" ]] || die "no tokenmill binary at $binary"
}

# llamacpp_cpu_flags: compiler flags that keep llama.cpp off AMX on hosts that have it (its AMX
# path faults in these VMs: the tile permission is never requested), so a GGML_NATIVE build's
# best path there is AVX-512-VNNI. Empty elsewhere.
llamacpp_cpu_flags() {
    if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
        echo "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
}

# llamacpp_isa: the SIMD paths a GGML_NATIVE llama.cpp build uses on this host, for reports.
llamacpp_isa() {
    local flags isa=()
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null) "
    for f in avx2 fma f16c avx512f avx512bw avx512_vnni avx_vnni avx512_bf16; do
        [[ "$flags" == *" $f "* ]] && isa+=("$f")
    done
    [[ -n "$(llamacpp_cpu_flags)" ]] && isa+=("(amx disabled)")
    echo "${isa[*]}"
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
        local cpu_flags
        cpu_flags="$(llamacpp_cpu_flags)"
        CMAKE_ARGS="${cpu_flags:+-DCMAKE_C_FLAGS='$cpu_flags' -DCMAKE_CXX_FLAGS='$cpu_flags'}" \
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

# ensure_llamacpp_native CACHE_DIR: builds llama.cpp's own tools (llama-server, llama-bench,
# llama-batched-bench, llama-quantize for the K-quant shape files) from the llama.cpp sources vendored in the pinned llama-cpp-python sdist
# (the same llama.cpp commit the Python package compiles), with cmake and ninja from a build
# venv, native CPU flags and no curl. Sets LLAMACPP_BIN to the directory holding the binaries.
ensure_llamacpp_native() {
    local cache_dir="$1"
    local root="$cache_dir/llamacpp-native-$LLAMA_CPP_PYTHON_VERSION"
    local tools=(llama-server llama-bench llama-batched-bench llama-quantize)
    LLAMACPP_BIN="$root/build/bin"
    local tool missing=0
    for tool in "${tools[@]}"; do [[ -x "$LLAMACPP_BIN/$tool" ]] || missing=1; done
    (( missing )) || return 0
    local venv="$root/build-venv"
    if [[ ! -x "$venv/bin/cmake" || ! -x "$venv/bin/ninja" ]]; then
        log "creating build venv $venv (cmake, ninja)"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet cmake ninja
    fi
    local sdist_dir="$root/sdist"
    local source="$sdist_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    if [[ ! -f "$source/CMakeLists.txt" ]]; then
        log "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (vendors llama.cpp)"
        mkdir -p "$sdist_dir"
        "$venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python \
            --dest "$sdist_dir" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        tar -xzf "$sdist_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$sdist_dir"
    fi
    [[ -f "$source/CMakeLists.txt" ]] || die "no llama.cpp sources in the sdist at $source"
    log "building ${tools[*]} (native, release; several minutes on 2 cores)"
    local cpu_flags
    cpu_flags="$(llamacpp_cpu_flags)"
    PATH="$venv/bin:$PATH" cmake -S "$source" -B "$root/build" -G Ninja \
        -DCMAKE_C_FLAGS="$cpu_flags" -DCMAKE_CXX_FLAGS="$cpu_flags" \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
    PATH="$venv/bin:$PATH" cmake --build "$root/build" --target "${tools[@]}" -j "$(nproc)" >/dev/null
    for tool in "${tools[@]}"; do
        [[ -x "$LLAMACPP_BIN/$tool" ]] || die "the llama.cpp build did not produce $tool"
    done
}
