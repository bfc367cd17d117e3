#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, when they are missing and we can.
set -u
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v clang >/dev/null || need+=(clang)
command -v systemd-analyze >/dev/null || need+=(systemd)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "ensure-test-tools: missing ${need[*]} (not root or no apt-get); tests that need them will skip" >&2
  exit 0
fi
echo "ensure-test-tools: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null \
  || echo "ensure-test-tools: apt-get failed; tests that need these tools will skip" >&2
