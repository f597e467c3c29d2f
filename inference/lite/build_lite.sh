#!/usr/bin/env bash
# Build the MindSpore Lite deploy tools against a Lite C++ SDK:
#   msrl-lite-runner       the inference server the Python client drives (shipped; no fault hooks)
#   msrl-lite-runner-test  the same server plus the fault-injection hook, for the test suite only
#   msrl-lite-convert      the ONNX -> .ms converter (only where the SDK ships the converter library)
#   libmsrl-lite.so, libmsrl-lite-inline.so  Lite in the calling process (inference/lite/inprocess.py)
#   msrl-lite-runner.json  the SDK's version, where it was read from, which MindIR versions it loads, and whether
#                          graphs run on the calling thread by default (INLINE_TESTED below)
#
# Usage (from anywhere):
#   bash inference/lite/build_lite.sh                                  # PyPI mindspore-lite 2.0.0 wheel -> .lite/
#   MSRL_LITE_SDK=/opt/mindspore-lite-2.3.1-linux-aarch64 MSRL_LITE_OUT=/opt/msrl/bin bash inference/lite/build_lite.sh
#   bash inference/lite/build_lite.sh --sdk DIR --out DIR [--runner-only]
#   bash inference/lite/build_lite.sh --sdk DIR --detect               # print what the SDK is, build nothing
#   bash inference/lite/build_lite.sh --arch aarch64                   # PyPI's aarch64 wheel, cross-built -> .lite/bin-aarch64
#
# --arch aarch64 on another host is the emulated ARM runtime's set-up (lite-aarch64): it needs the cross compiler
# and qemu-user (Debian: apt-get install g++-aarch64-linux-gnu qemu-user); what a runner built for another
# architecture says about its Lite (the MindIR limit) is asked of it under qemu-aarch64 -cpu $MSRL_ARM_CPU
# (default neoverse-n1, see inference/runtimes/lite_aarch64.py).
#
# An SDK is either the official tarball layout (DIR/runtime/include/api/model.h, DIR/runtime/lib) or the
# wheel layout (DIR/include/api/model.h, DIR/lib; the unpacked mindspore_lite/ package directory).
# Environment: CXX (e.g. aarch64-linux-gnu-g++ to cross-compile), MSRL_LITE_SDK_VERSION (when the SDK carries
# no version), MSRL_LITE_LIB (the runtime library to link, e.g. mindspore-lite), MSRL_LITE_HOME (where the
# PyPI SDK is fetched and, without --out, the binaries go; default .lite/ of the checkout).
set -euo pipefail

LITE_WHEEL_VERSION=2.0.0
# The Lite builds ("VERSION ARCH") on which running Lite's graph on the calling thread (inference/lite/runner/inline_run.h)
# was tested, bitwise against Lite's own hand-off to its actor thread: inline runs are on by default for these only.
# Elsewhere they are off unless MSRL_LITE_INLINE=1 (python -m inference.doctor BUNDLE compares the two ways).
INLINE_TESTED=("2.0.0 x86_64" "2.0.0 aarch64")
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(dirname "$(dirname "$HERE")")"  # the checkout (inference/lite/ is two levels down)
SRC="$HERE/runner"
CONVERTER_SRC="$ROOT/export/lite_converter.cc"
CXX="${CXX:-}"  # default: g++, or the cross compiler for another architecture (--arch)

SDK="${MSRL_LITE_SDK:-}"
OUT="${MSRL_LITE_OUT:-}"
RUNNER_ONLY=0
DETECT_ONLY=0
HOST_ARCH=$(uname -m)
ARCH=""
ARM_CPU="${MSRL_ARM_CPU:-neoverse-n1}"  # the emulated CPU of lite-aarch64's probe (its runtime's default too)
SYSROOT=/usr/aarch64-linux-gnu          # where Debian's cross toolchain keeps the aarch64 C and C++ libraries
CROSS_PACKAGES="apt-get install g++-aarch64-linux-gnu qemu-user"

say() { printf '[build_lite] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --sdk) SDK="${2:?--sdk needs a directory}"; shift 2 ;;
        --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
        --runner-only) RUNNER_ONLY=1; shift ;;
        --detect) DETECT_ONLY=1; shift ;;
        --arch) ARCH="${2:?--arch needs x86_64 or aarch64}"; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

[[ -f "$SRC/main.cc" ]] || die "runner sources not found in $SRC"
case "${ARCH:=$HOST_ARCH}" in
    x86_64|aarch64) ;;
    *) die "--arch must be x86_64 or aarch64, got '$ARCH'" ;;
esac
# Another architecture than this host's: a cross compiler builds it and qemu-user runs it (the probe below, and the
# lite-aarch64 runtime). Both are asked for here, in one line, before anything is fetched.
FOREIGN=0
if [[ "$ARCH" != "$HOST_ARCH" ]]; then
    FOREIGN=1
    [[ "$ARCH" == aarch64 ]] || die "building for $ARCH on a $HOST_ARCH host is not supported (build on the device)"
    CXX="${CXX:-aarch64-linux-gnu-g++}"
    if ((! DETECT_ONLY)) && ! command -v "$CXX" >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1 || [[ ! -d "$SYSROOT/lib" ]]; then
        die "the aarch64 runner needs the cross compiler $CXX and qemu-aarch64 ($CROSS_PACKAGES)"
    fi
fi

json_str() {  # a JSON string literal (paths and versions hold no control characters)
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

# ---- 1. the SDK: user-given, or the PyPI wheel's, fetched into .lite/ -----------------------------------
CXX="${CXX:-g++}"
SUFFIX=""  # this host's architecture: .lite/{dl,sdk,bin}; another: .lite/{dl,sdk,bin}-aarch64
((FOREIGN)) && SUFFIX="-$ARCH"
if [[ -z "$SDK" ]]; then
    LITE="${MSRL_LITE_HOME:-$ROOT/.lite}"
    DL="$LITE/dl$SUFFIX"
    SDK="$LITE/sdk$SUFFIX"
    OUT="${OUT:-$LITE/bin$SUFFIX}"
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
    command -v "$PY" >/dev/null 2>&1 || die "no Python found to run pip / unzip the wheel"
    shopt -s nullglob
    wheels=("$DL"/mindspore_lite-"$LITE_WHEEL_VERSION"-*.whl)
    if ((${#wheels[@]} == 0)); then
        say "downloading the mindspore-lite==$LITE_WHEEL_VERSION wheel for $ARCH (56-170 MB) into $DL"
        mkdir -p "$DL"
        "$PY" -m pip download "mindspore-lite==$LITE_WHEEL_VERSION" --no-deps --only-binary=:all: \
            --python-version 3.7 --platform "manylinux2014_$ARCH" -d "$DL" -q
        wheels=("$DL"/mindspore_lite-"$LITE_WHEEL_VERSION"-*.whl)
        ((${#wheels[@]} > 0)) || die "pip download did not produce a mindspore_lite wheel in $DL"
    fi
    WHEEL="${wheels[0]}"
    # The stamp names the wheel and the unpack layout, so a re-run only unpacks when either changed.
    stamp="$(basename "$WHEEL") layout-2"
    if [[ "$(cat "$SDK/.wheel" 2>/dev/null || true)" != "$stamp" ]]; then
        say "unpacking the wheel's SDK (include/, lib/, version.py) into $SDK"
        rm -rf "$SDK"
        mkdir -p "$SDK"
        "$PY" - "$WHEEL" "$SDK" <<'EOF'
import os
import sys
import zipfile

wheel, dest = sys.argv[1], sys.argv[2]
keep = ("mindspore_lite/include/", "mindspore_lite/lib/", "mindspore_lite/version.py", "mindspore_lite/.commit_id")
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        if info.is_dir() or not info.filename.startswith(keep):
            continue
        target = os.path.join(dest, info.filename[len("mindspore_lite/"):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
EOF
        printf '%s\n' "$stamp" >"$SDK/.wheel"
    fi
fi
[[ -d "$SDK" ]] || die "Lite SDK directory not found: $SDK"
SDK="$(cd "$SDK" && pwd -P)"
OUT="${OUT:-${MSRL_LITE_HOME:-$ROOT/.lite}/bin$SUFFIX}"

# ---- 2. layout ------------------------------------------------------------------------------------------
if [[ -f "$SDK/runtime/include/api/model.h" ]]; then
    LAYOUT=tarball
    INC_ROOT="$SDK/runtime"
    LIB="$SDK/runtime/lib"
elif [[ -f "$SDK/include/api/model.h" ]]; then
    LAYOUT=wheel
    INC_ROOT="$SDK"
    LIB="$SDK/lib"
else
    die "$SDK is not a Lite SDK: expected runtime/include/api/model.h (official tarball) or include/api/model.h (wheel)"
fi

if [[ -n "${MSRL_LITE_LIB:-}" ]]; then
    RTLIB="lib${MSRL_LITE_LIB#lib}"
    RTLIB="${RTLIB%.so}.so"
else
    RTLIB=""
    for name in libmindspore-lite.so libmindspore-extendrt.so libmindspore-extendrt_python.so; do
        if [[ -e "$LIB/$name" ]]; then RTLIB=$name; break; fi
    done
fi
[[ -n "$RTLIB" && -e "$LIB/$RTLIB" ]] || die "no Lite runtime library in $LIB (looked for libmindspore-lite.so, \
libmindspore-extendrt.so, libmindspore-extendrt_python.so; set MSRL_LITE_LIB)"

# ---- 3. version: from the SDK's own files, most specific first ---------------------------------------------
VERSION=""
VSRC=""
semver='[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*'
if [[ -n "${MSRL_LITE_SDK_VERSION:-}" ]]; then
    VERSION="$MSRL_LITE_SDK_VERSION"
    VSRC="MSRL_LITE_SDK_VERSION"
fi
if [[ -z "$VERSION" ]]; then  # include/version.h: ms_version_major = X; (or #define MS_VERSION_MAJOR X)
    for h in "$INC_ROOT/include/version.h" "$SDK/include/version.h"; do
        [[ -f "$h" ]] || continue
        part() { sed -nE "s/.*(ms_version_$1 *=|define MS_VERSION_${1^^}) *([0-9]+).*/\2/p" "$h" | head -1; }
        major=$(part major) minor=$(part minor) rev=$(part revision)
        if [[ -n "$major" && -n "$minor" && -n "$rev" ]]; then
            VERSION="$major.$minor.$rev"
            VSRC="${h#"$SDK"/}"
            break
        fi
    done
fi
if [[ -z "$VERSION" && -f "$SDK/version.py" ]]; then  # the wheel's mindspore_lite/version.py
    VERSION=$(sed -nE "s/^__version__ *= *['\"]([^'\"]+)['\"].*/\1/p" "$SDK/version.py" | head -1)
    VSRC="version.py"
fi
if [[ -z "$VERSION" ]]; then  # an installed wheel: site-packages/mindspore_lite-X.dist-info/METADATA
    for meta in "$SDK"/../mindspore_lite-*.dist-info/METADATA; do
        [[ -f "$meta" ]] || continue
        VERSION=$(sed -nE 's/^Version: *(.+)$/\1/p' "$meta" | head -1)
        VSRC="$(basename "$(dirname "$meta")")/METADATA"
        break
    done
fi
if [[ -z "$VERSION" ]]; then  # the library's own "MindSpore Lite X.Y.Z" string (official builds carry it)
    VERSION=$(grep -a -o -m1 -E "MindSpore Lite $semver" "$LIB/$RTLIB" 2>/dev/null | head -1 | sed 's/^MindSpore Lite //' || true)
    [[ -n "$VERSION" ]] && VSRC="strings of $RTLIB"
fi
if [[ -z "$VERSION" ]]; then  # the official tarball's directory name: mindspore-lite-X.Y.Z-linux-<arch>
    VERSION=$(basename "$SDK" | sed -nE "s/^mindspore-lite-($semver)-linux-.*/\1/p")
    [[ -n "$VERSION" ]] && VSRC="directory name"
fi
[[ -n "$VERSION" ]] || die "cannot tell the Lite version of $SDK (no include/version.h, version.py, dist-info, \
library string or mindspore-lite-X.Y.Z-* directory name); set MSRL_LITE_SDK_VERSION=X.Y.Z"
[[ "$VERSION" =~ ^$semver$ ]] || die "Lite version '$VERSION' read from $VSRC is not X.Y.Z"

# ELF machine of the runtime library vs the compiler's target: a mismatch means a cross-compiler is needed.
elf_arch() {
    case "$(od -An -t x2 -j 18 -N 2 "$1" 2>/dev/null | tr -d ' ')" in
        003e) echo x86_64 ;; 00b7) echo aarch64 ;; 0028) echo arm ;; *) echo unknown ;;
    esac
}
SDK_ARCH=$(elf_arch "$(readlink -f "$LIB/$RTLIB")")

# Inline runs by default: only on a tested build (INLINE_TESTED); compiled in, so the runner and libmsrl-lite.so obey
# the same answer, and recorded with its reason.
INLINE_DEFAULT=false
tested="" tested_json=""
for pair in "${INLINE_TESTED[@]}"; do
    tested+="${tested:+, }$pair"
    tested_json+="${tested_json:+, }$(json_str "$pair")"
done
INLINE_WHY="Lite $VERSION on $SDK_ARCH is not a build inline runs were tested on ($tested): graphs run on Lite's \
actor thread unless MSRL_LITE_INLINE=1"
for pair in "${INLINE_TESTED[@]}"; do
    if [[ "$pair" == "$VERSION $SDK_ARCH" ]]; then
        INLINE_DEFAULT=true
        INLINE_WHY="Lite $VERSION on $SDK_ARCH: inline runs tested bitwise against Lite's hand-off; MSRL_LITE_INLINE=0 \
turns them off"
    fi
done
INLINE_JSON="{\"default\": $INLINE_DEFAULT, \"why\": $(json_str "$INLINE_WHY"), \"tested\": [$tested_json]}"

if ((DETECT_ONLY)); then
    printf '{"sdk": %s, "sdk_layout": "%s", "lite_version": %s, "lite_version_source": %s, "runtime_library": "%s", "arch": "%s", "inline": %s}\n' \
        "$(json_str "$SDK")" "$LAYOUT" "$(json_str "$VERSION")" "$(json_str "$VSRC")" "$RTLIB" "$SDK_ARCH" "$INLINE_JSON"
    exit 0
fi

command -v "$CXX" >/dev/null 2>&1 || die "C++ compiler '$CXX' not found; install g++ (e.g. apt-get install g++)"
TARGET=$("$CXX" -dumpmachine)
case "$TARGET" in
    x86_64*) CXX_ARCH=x86_64 ;; aarch64*) CXX_ARCH=aarch64 ;; arm*) CXX_ARCH=arm ;; *) CXX_ARCH=unknown ;;
esac
if [[ "$SDK_ARCH" != unknown && "$CXX_ARCH" != unknown && "$SDK_ARCH" != "$CXX_ARCH" ]]; then
    die "the SDK is built for $SDK_ARCH but $CXX targets $TARGET; set CXX (e.g. CXX=aarch64-linux-gnu-g++)"
fi
say "SDK $SDK ($LAYOUT layout, $SDK_ARCH), Lite $VERSION (from $VSRC), linking $RTLIB"

# ---- 4. compile -----------------------------------------------------------------------------------------
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd -P)"
# The C++ string ABI the SDK was built with: most of its API passes strings as vector<char>, but the kernel
# callbacks' MSCallBackParam holds std::string, which must have Lite's own layout (the PyPI 2.0.0 wheel: the old
# ABI; reading it with the new one threw std::bad_alloc).
if nm -D --defined-only "$LIB/$RTLIB" 2>/dev/null | grep -q __cxx11; then CXX_ABI=1; else CXX_ABI=0; fi
CXXFLAGS=(-O2 -std=c++17 -Wall -fPIC -D_GLIBCXX_USE_CXX11_ABI=$CXX_ABI -I"$INC_ROOT" -I"$INC_ROOT/include"
          -DMSRL_LITE_VERSION="\"$VERSION\"" -DMSRL_LITE_INLINE_DEFAULT=$([[ $INLINE_DEFAULT == true ]] && echo 1 || echo 0))
# -rpath-link resolves the runtime's own dependencies at link time; a DT_RPATH (not RUNPATH, which is not
# inherited by those indirect dependencies) lets the binaries run without LD_LIBRARY_PATH.
LDFLAGS=(-L"$LIB" -Wl,-rpath-link,"$LIB" -Wl,--disable-new-dtags -Wl,-rpath,"$LIB")
COMMON=(main protocol json lite_log errors mindir_probe pinning server inline_run device_context fork_server)
INPROCESS=(inprocess protocol json lite_log errors pinning device_context)  # libmsrl-lite.so: Lite in the caller's process
# inline_run.cc defines Lite's ActorThreadPool::PushActorToQueue so the graph runs on the calling thread: the
# runner exports it from the executable; in a Python process it is libmsrl-lite-inline.so, which
# inprocess.py loads RTLD_GLOBAL before libmsrl-lite.so (and so before Lite's plugins).
PUSH_SYMBOL=_ZN9mindspore15ActorThreadPool16PushActorToQueueEPNS_9ActorBaseE

# Rebuild when the sources, the SDK, its version or the compiler changed (content hash, not timestamps).
key=$( { cat "$SRC"/*.cc "$SRC"/*.h "$0"; [[ -f "$CONVERTER_SRC" ]] && cat "$CONVERTER_SRC";
         echo "$SDK $VERSION $SDK_ARCH $RTLIB $CXX $TARGET $RUNNER_ONLY $CXX_ABI $INLINE_DEFAULT";
         # a foreign runner's record says what was probed under qemu, on which CPU
         if [[ "$SDK_ARCH" != "$HOST_ARCH" ]]; then echo "$ARM_CPU $(command -v qemu-aarch64 || true)"; fi; } \
       | sha256sum | cut -c1-16)

compile() {  # output, libraries..., -- sources (.cc or objects)...
    local out=$1
    shift
    local libs=() srcs=()
    while [[ $1 != -- ]]; do libs+=("$1"); shift; done
    shift
    srcs=("$@")
    "$CXX" "${CXXFLAGS[@]}" "${srcs[@]}" -o "$out.tmp" "${LDFLAGS[@]}" "${libs[@]}" || die "compiling $(basename "$out") failed"
    mv -f "$out.tmp" "$out"
}

# The runner and the test runner share every source but their request hook: compile each source once, as many at
# a time as there are CPUs (the Lite headers make one file take 1-8 s), then link both binaries from the objects.
compile_objects() {  # object dir, sources...
    local dir=$1 jobs running=0 failed=0 src
    shift
    jobs=$(nproc 2>/dev/null || echo 2)
    for src in "$@"; do
        "$CXX" "${CXXFLAGS[@]}" -c "$src" -o "$dir/$(basename "${src%.cc}").o" &
        if ((++running >= jobs)); then wait -n || failed=1; running=$((running - 1)); fi
    done
    while ((running > 0)); do wait -n || failed=1; running=$((running - 1)); done
    ((failed == 0)) || die "compiling the runner's sources failed (see the compiler's messages above)"
}

LINK_RT="-l${RTLIB#lib}"
LINK_RT="${LINK_RT%.so}"
CONVERTER=null
if [[ "$(cat "$OUT/.build-key" 2>/dev/null || true)" == "$key" && -x "$OUT/msrl-lite-runner" \
      && -x "$OUT/msrl-lite-runner-test" && -f "$OUT/libmsrl-lite.so" && -f "$OUT/libmsrl-lite-inline.so" \
      && -f "$OUT/msrl-lite-runner.json" ]]; then
    say "$OUT is up to date"
    exit 0
fi
rm -f "$OUT/.build-key"
OBJ=$(mktemp -d "$OUT/.objects.XXXXXX")
trap 'rm -rf "$OBJ"' EXIT
srcs=()
for f in "${COMMON[@]}" inprocess request_hook_none request_hook_fault; do srcs+=("$SRC/$f.cc"); done
say "compiling the runner's sources"
compile_objects "$OBJ" "${srcs[@]}"
objs=()
for f in "${COMMON[@]}"; do objs+=("$OBJ/$f.o"); done
# The executable exports the one symbol Lite's libraries must bind to (a dynamic list: older linkers than the
# 2.35 that brought --export-dynamic-symbol read it too).
printf '{ %s; };\n' "$PUSH_SYMBOL" >"$OBJ/inline.dynlist"
EXPORT_PUSH="-Wl,--dynamic-list=$OBJ/inline.dynlist"
say "linking msrl-lite-runner and msrl-lite-runner-test (with the fault-injection hook)"
compile "$OUT/msrl-lite-runner" "$LINK_RT" -ldl "$EXPORT_PUSH" -- "${objs[@]}" "$OBJ/request_hook_none.o"
compile "$OUT/msrl-lite-runner-test" "$LINK_RT" -ldl "$EXPORT_PUSH" -- "${objs[@]}" "$OBJ/request_hook_fault.o"
say "linking libmsrl-lite.so and libmsrl-lite-inline.so (Lite in the calling process)"
compile "$OUT/libmsrl-lite-inline.so" -shared -ldl -- "$OBJ/inline_run.o"
lib_objs=()
for f in "${INPROCESS[@]}"; do lib_objs+=("$OBJ/$f.o"); done
compile "$OUT/libmsrl-lite.so" -shared "$LINK_RT" -L"$OUT" -lmsrl-lite-inline "-Wl,-rpath,\$ORIGIN" -- "${lib_objs[@]}"
if ((RUNNER_ONLY)); then
    say "converter skipped (--runner-only)"
elif [[ ! -f "$CONVERTER_SRC" ]]; then
    say "converter skipped ($CONVERTER_SRC not here; the deploy box only needs the runner)"
elif [[ ! -e "$LIB/libmindspore_converter.so" ]]; then
    say "converter skipped (no libmindspore_converter.so in $LIB; the deploy box only needs the runner)"
else
    say "compiling msrl-lite-convert"
    # Its std::thread::hardware_concurrency (one core: calibration on one thread, see the source) is what Lite binds to.
    printf '{ %s; };\n' _ZNSt6thread20hardware_concurrencyEv >"$OBJ/converter.dynlist"
    compile "$OUT/msrl-lite-convert" -lmindspore_converter -lmindspore_core "-Wl,--dynamic-list=$OBJ/converter.dynlist" \
        -- -I"$SRC" "$CONVERTER_SRC" "$OBJ/lite_log.o" "$OBJ/protocol.o"
    CONVERTER='"msrl-lite-convert"'
fi

# ---- 5. which MindIR versions this Lite reads: asked of the SDK itself, natively or under qemu-user ---------------
# A runner for another architecture runs here under qemu-aarch64 (user-mode emulation: the ARM code is translated
# instruction by instruction, so its answers are the ARM kernels' own) on the CPU model lite-aarch64 emulates.
LAUNCH=()
EMULATION=null
if [[ "$SDK_ARCH" != "$HOST_ARCH" && "$SDK_ARCH" == aarch64 ]] && command -v qemu-aarch64 >/dev/null 2>&1 \
      && [[ -d "$SYSROOT/lib" ]]; then
    LAUNCH=(qemu-aarch64 -L "$SYSROOT" -cpu "$ARM_CPU")
    QEMU_VERSION=$(qemu-aarch64 --version | head -1)
    EMULATION="{\"launcher\": [\"qemu-aarch64\", \"-L\", $(json_str "$SYSROOT")], \"qemu\": $(json_str "$QEMU_VERSION"), \
\"probed_cpu\": $(json_str "$ARM_CPU")}"
fi
MAX_MINDIR=null
if [[ "$SDK_ARCH" != "$HOST_ARCH" && ${#LAUNCH[@]} -eq 0 ]]; then
    RULE="not probed (a $SDK_ARCH runner does not run on this $HOST_ARCH host without qemu-user); python -m inference.doctor probes it on the device"
elif info=$(GLOG_v=3 "${LAUNCH[@]}" "$OUT/msrl-lite-runner" --info 2>/dev/null); then  # Lite's errors logged
    MAX_MINDIR=$(sed -nE 's/.*"max_mind_ir_version": ([0-9]+|null).*/\1/p' <<<"$info")
    MAX_MINDIR=${MAX_MINDIR:-null}
    where=""
    ((${#LAUNCH[@]})) && where=" (asked under qemu-aarch64 -cpu $ARM_CPU)"
    if [[ "$MAX_MINDIR" == null ]]; then
        RULE="probe gave no answer$where: $(sed -nE 's/.*"mind_ir_probe": "([^"]*)".*/\1/p' <<<"$info")"
    else
        RULE="probe$where: Lite's own refusal of a MindIR header with version 2^31-1 names mind_ir::Version_MAX; it loads 0..max"
    fi
else
    RULE="not probed (the runner did not answer --info on this build host); python -m inference.doctor probes it on the device"
fi

cat >"$OUT/msrl-lite-runner.json" <<EOF
{
  "schema": "msrl-consistency/lite-runner",
  "schema_version": 1,
  "lite_version": $(json_str "$VERSION"),
  "lite_version_source": $(json_str "$VSRC"),
  "sdk": $(json_str "$SDK"),
  "sdk_layout": "$LAYOUT",
  "runtime_library": "$RTLIB",
  "arch": "$SDK_ARCH",
  "compiler": $(json_str "$CXX ($TARGET)"),
  "max_mind_ir_version": $MAX_MINDIR,
  "mind_ir_rule": $(json_str "$RULE"),
  "runner": "msrl-lite-runner",
  "test_runner": "msrl-lite-runner-test",
  "library": "libmsrl-lite.so",
  "inline_library": "libmsrl-lite-inline.so",
  "inline": $INLINE_JSON,
  "emulation": $EMULATION,
  "converter": $CONVERTER,
  "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF
printf '%s\n' "$key" >"$OUT/.build-key"
say "done: $OUT (Lite $VERSION, MindIR <= ${MAX_MINDIR/null/unknown}, inline runs by default: $INLINE_DEFAULT)"
