#!/usr/bin/env bash
# Build the MindSpore Lite deploy tools (runner + ONNX converter) against the C++ SDK shipped inside the
# PyPI mindspore-lite 2.0.0 wheel. The wheel's Python module is cp37-only, but its C++ API works from any
# program, so we only unpack headers and shared libraries. Run from the repository root (`make lite`).
set -euo pipefail

LITE_VERSION=2.0.0
ROOT="$(pwd -P)"
LITE="$ROOT/.lite"
DL="$LITE/dl"
SDK="$LITE/sdk"
BIN="$LITE/bin"
CXX="${CXX:-g++}"

say() { printf '[build_lite] %s\n' "$*"; }
die() { printf '[build_lite] error: %s\n' "$*" >&2; exit 1; }

[[ -f inference/lite_runner.cc && -f export/lite_converter.cc ]] || die "run from the repository root"
command -v "$CXX" >/dev/null 2>&1 || die "C++ compiler '$CXX' not found; install g++ (e.g. apt-get install g++)"

if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
command -v "$PY" >/dev/null 2>&1 || die "no Python found to run pip / unzip the wheel"

shopt -s nullglob
wheels=("$DL"/mindspore_lite-"$LITE_VERSION"-*.whl)
if ((${#wheels[@]} == 0)); then
    say "1/4 downloading mindspore-lite==$LITE_VERSION wheel (~170 MB) into .lite/dl"
    mkdir -p "$DL"
    "$PY" -m pip download "mindspore-lite==$LITE_VERSION" --no-deps --only-binary=:all: \
        --python-version 3.7 --platform manylinux2014_x86_64 -d "$DL" -q
    wheels=("$DL"/mindspore_lite-"$LITE_VERSION"-*.whl)
    ((${#wheels[@]} > 0)) || die "pip download did not produce a mindspore_lite wheel in $DL"
else
    say "1/4 wheel present: ${wheels[0]#"$ROOT"/}"
fi
WHEEL="${wheels[0]}"

# The stamp records which wheel the SDK came from, so a re-run only unpacks when the wheel changed.
if [[ "$(cat "$SDK/.wheel" 2>/dev/null || true)" != "$(basename "$WHEEL")" ]]; then
    say "2/4 unpacking SDK (include/, lib/) into .lite/sdk"
    rm -rf "$SDK"
    mkdir -p "$SDK"
    "$PY" - "$WHEEL" "$SDK" <<'EOF'
import os
import sys
import zipfile

wheel, dest = sys.argv[1], sys.argv[2]
prefixes = ("mindspore_lite/include/", "mindspore_lite/lib/")
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        if info.is_dir() or not info.filename.startswith(prefixes):
            continue
        target = os.path.join(dest, info.filename[len("mindspore_lite/"):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
EOF
    [[ -f "$SDK/include/api/model.h" && -f "$SDK/lib/libmindspore-extendrt_python.so" ]] \
        || die "wheel $(basename "$WHEEL") does not contain the expected Lite SDK layout"
    basename "$WHEEL" >"$SDK/.wheel"
else
    say "2/4 SDK already unpacked in .lite/sdk"
fi

mkdir -p "$BIN"
CXXFLAGS=(-O2 -std=c++17 -Wall -I"$SDK" -I"$SDK/include" -DMSRL_LITE_WHEEL_VERSION="\"$LITE_VERSION\"")
# -rpath-link resolves the runtime's own dependencies at link time; a DT_RPATH (not RUNPATH, which is not
# inherited by those indirect dependencies) lets the binaries run without LD_LIBRARY_PATH.
LDFLAGS=(-L"$SDK/lib" -Wl,-rpath-link,"$SDK/lib" -Wl,--disable-new-dtags -Wl,-rpath,"$SDK/lib")

build() {  # step, source, output, libraries...
    local step=$1 src=$2 out=$3
    shift 3
    if [[ -x "$out" && "$out" -nt "$src" && "$out" -nt "$0" && "$out" -nt "$SDK/.wheel" ]]; then
        say "$step ${out#"$ROOT"/} is up to date"
        return
    fi
    say "$step compiling $src -> ${out#"$ROOT"/}"
    "$CXX" "${CXXFLAGS[@]}" "$src" -o "$out.tmp" "${LDFLAGS[@]}" "$@" || die "compiling $src failed"
    mv -f "$out.tmp" "$out"
}

build 3/4 inference/lite_runner.cc "$BIN/msrl-lite-runner" -lmindspore-extendrt_python
build 4/4 export/lite_converter.cc "$BIN/msrl-lite-convert" -lmindspore_converter -lmindspore_core
say "done: .lite/bin/msrl-lite-runner, .lite/bin/msrl-lite-convert"
