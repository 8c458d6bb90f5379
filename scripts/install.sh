#!/usr/bin/env bash
# Installs the C/C++ library: libstepscope.so and .a, include/stepscope.h(pp), and a pkg-config
# file, under PREFIX (lib/, include/, lib/pkgconfig/).
# Usage: scripts/install.sh PREFIX [BUILD_DIR]   (BUILD_DIR: where cargo put the libraries;
# default target/release)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/install.sh PREFIX [BUILD_DIR]}
build=${2:-target/release}
for f in libstepscope.so libstepscope.a; do
  [ -f "$build/$f" ] || { echo "install: $build/$f not found: run 'cargo build --release' first" >&2; exit 1; }
done
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
prefix=$(cd "$prefix" && pwd)
install -m 0755 "$build/libstepscope.so" "$prefix/lib/"
install -m 0644 "$build/libstepscope.a" "$prefix/lib/"
install -m 0644 include/stepscope.h include/stepscope.hpp "$prefix/include/"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" stepscope.pc.in > "$prefix/lib/pkgconfig/stepscope.pc"
echo "installed stepscope $version under $prefix (pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig)"
