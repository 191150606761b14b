#!/usr/bin/env bash
# Installs the Debian packages kimirt builds with (as root, or with sudo) and builds it into
# ./build. Safe to run again: installed packages are skipped, the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config googletest libgtest-dev libbenchmark-dev nlohmann-json3-dev libpcre2-dev libcpp-httplib-dev libboost1.81-dev gnuplot-nox python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
