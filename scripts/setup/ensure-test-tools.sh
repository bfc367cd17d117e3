#!/usr/bin/env bash
# `make test-tools`: installs the Debian packages some tests need, when they are missing.
# Only this explicit step calls a package manager; `make test` never does.
set -u
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v clang >/dev/null || need+=(clang)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -eq 0 ]; then
  echo "test-tools: all present"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "test-tools: missing ${need[*]} and no apt-get here: install them by hand" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "test-tools: missing ${need[*]}: run sudo apt-get install ${need[*]}" >&2
  exit 1
fi
echo "test-tools: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null; }; then
  echo "test-tools: apt-get install ${need[*]} failed" >&2
  exit 1
fi
