#!/usr/bin/env bash
# Python packages the test suite compares against (the reference tokenizer, the official OpenAI
# client, pytest) and NumPy for tools/reference (the float64 model reference that makes and checks
# the fixtures' goldens). Installed for the python3 on PATH; on a Debian system Python (PEP 668) the
# install goes to the user site instead of failing.
set -euo pipefail
pkgs=(tiktoken regex openai pytest numpy)
if python3 -c "import tiktoken, regex, openai, pytest, numpy" 2>/dev/null; then exit 0; fi
python3 -m pip install --quiet --disable-pip-version-check "${pkgs[@]}" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages "${pkgs[@]}"
