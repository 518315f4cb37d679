#!/usr/bin/env bash
# Builds the native module with AddressSanitizer and UBSan and runs the
# native/Python differential tests and the fuzz corpus against it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$root/sendstream" "$work/"
find "$work/sendstream" -name "*.so" -delete
gcc -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -pthread \
    $(python3-config --includes) "$root/sendstream/codec/_native.c" \
    -o "$work/sendstream/codec/_native$(python3-config --extension-suffix)"
# run from the copy: `python3 -m pytest` puts the working directory first on sys.path
cd "$work"
export PYTHONPATH="$work"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# the sanitized build must be the one imported
python3 -c "from sendstream.codec.backend import native as n; assert n() and n().module.__file__.startswith('$work'), n()"
t="$root/tests"
python3 -m pytest -q -p no:cacheprovider --rootdir "$root" "$t/unit/test_native.py" "$t/unit/test_crc_kernels.py" "$t/integration/test_native_cli.py" \
    "$t/unit/test_restart.py" "$t/integration/test_restart_cli.py" "$t/unit/test_properties.py" \
    "$t/unit/test_corrupt.py" "$t/integration/test_fuzz_corpus.py" -k "not live" "$@"
